"""The GPU bitmask kernel against xgrammar's kernels, the torch reference and a plain kernel.

Measured side by side in one process on one GPU, for every batch x vocab x dtype x mask density:
kernel time (the GPU time CUPTI records for every kernel and copy of a call, masks already on
the device, mean of repeated calls; ours and xgrammar's CUDA kernel called in turn, with the 95%
interval of their difference, everything else, ours too, call after call alone), the host time
of one full ``apply`` (pointers, one async copy, an event, the launch: what the logits
post-processor pays per step) in four forms (one tensor with a graph replay, the same as three
driver calls, one tensor per request as the engines pass them, and one tensor with the launch
plan set beforehand instead of picked from a sample of the masks), and the kernel time as a
multiple of the bandwidth floor. Host times are taken with the GPU idle (right after a
synchronise) and, for ours in the first and third forms and for xgrammar's op, also busy (the call
queued behind a running kernel, as the engine calls the post-processor while its forward pass runs).
xgrammar's kernel files are loaded straight from its wheel (``--xgrammar DIR`` = the unpacked
wheel); its CUDA kernel compiles at load time with nvcc.

    python -m bench.mask_kernel --xgrammar /tmp/xgrammar --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType  # type: ignore[attr-defined]

from backend.kernels.cuda_masking import CudaBitmaskApplier
from backend.kernels.launch_policy import GROUP_MASK_BYTES, LaunchPlan, PolicySettings
from backend.masking import apply_token_bitmask_cpu
from bench.plain_kernel import PLAIN_KERNELS, run_plain
from bench.reports import host_cpu, write_report

logger = logging.getLogger("bench.mask_kernel")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Nominal HBM bandwidth, bytes/s.
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}


def load_module(path: Path, name: str) -> ModuleType | None:
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a missing toolchain or triton: report, compare the rest
        logger.warning("cannot load %s: %s", path.name, exc)
        return None
    return module


STRING_REFUSED_EVERY = 50  # the "string" masks refuse vocab // 50 tokens a row
MASK_KINDS = ("all", "half", "one", "mixed", "string", "tenth", "few")


def make_masks(kind: str, batch: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """all: everything allowed; half: random bits; one: one token a row; mixed: even rows allow
    everything, odd rows one token; string: all but 2% of the tokens, spread over the vocabulary (a
    JSON string's content refuses the tokens with a quote, a backslash or a control character);
    tenth: every tenth row (0, 10, ...) a string's, the others allow everything (a batch in which a
    few requests are constrained); few: as many rows as in tenth, drawn at random, a string's."""
    words = (vocab + 31) // 32
    if kind == "few":
        masks = torch.full((batch, words), -1, dtype=torch.int32)
        constrained = torch.randperm(batch, generator=generator)[: _tenth_rows(batch)]
        masks[constrained] = make_masks("string", len(constrained), vocab, generator)
        return masks
    if kind == "tenth":
        masks = torch.full((batch, words), -1, dtype=torch.int32)
        masks[::10] = make_masks("string", len(masks[::10]), vocab, generator)
        return masks
    if kind == "mixed":
        masks = make_masks("one", batch, vocab, generator)
        masks[::2] = -1
        return masks
    if kind == "string":
        masks = torch.full((batch, words), -1, dtype=torch.int32)
        refused = torch.randint(0, vocab, (batch, vocab // STRING_REFUSED_EVERY), generator=generator).numpy()
        flat_words = np.arange(batch)[:, None] * words + (refused >> 5)
        np.bitwise_and.at(masks.numpy().reshape(-1), flat_words, (~(np.int64(1) << (refused & 31))).astype(np.int32))
        return masks
    if kind == "all":
        return torch.full((batch, words), -1, dtype=torch.int32)
    if kind == "half":
        return torch.randint(-(2**31), 2**31, (batch, words), dtype=torch.int64, generator=generator).to(torch.int32)
    masks = torch.zeros((batch, words), dtype=torch.int32)
    tokens = torch.randint(0, vocab, (batch,), generator=generator)
    for row, token in enumerate(tokens.tolist()):
        masks[row, token >> 5] = torch.tensor(1 << (token & 31), dtype=torch.int64).to(torch.int32)
    return masks


def gpu_time_us(launch: Callable[[], object], repeats: int, *, kernels_only: bool = False) -> float:
    """GPU time of one call: the device time of every kernel and copy it ran, from CUPTI (torch.profiler).

    Launch gaps and host overhead are left out, whichever library or stream launched the work.
    ``kernels_only`` leaves the copies out too.
    """
    launch()
    torch.cuda.synchronize()
    events = _device_events([launch] * repeats, kernels_only=kernels_only)
    if not events:
        raise RuntimeError("the profiler saw no GPU work")
    return sum(event.elapsed_us for event in events) / repeats


@dataclass(frozen=True)
class DeviceEvent:
    """One kernel or copy the profiler saw: its name, start and duration."""

    name: str
    start_us: float
    elapsed_us: float


def _device_events(calls: Sequence[Callable[[], object]], *, kernels_only: bool = False) -> list[DeviceEvent]:
    """The GPU work of ``calls``, made in order under CUPTI (torch.profiler), in the order it started."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for call in calls:
            call()
        torch.cuda.synchronize()
    events = [
        DeviceEvent(e.name, e.time_range.start, e.time_range.elapsed_us())
        for e in profile.events()
        if e.device_type == DeviceType.CUDA and not (kernels_only and e.name.lower().startswith(("memcpy", "memset")))
    ]
    return sorted(events, key=lambda event: event.start_us)


@dataclass(frozen=True)
class PairedTimes:
    """GPU µs of one call of each of two launches, timed in turn, and how sure the difference is."""

    first_us: float
    second_us: float
    difference_ci_us: float  # half-width of the 95% interval of the mean of first - second, per call


def paired_gpu_time_us(first: Callable[[], object], second: Callable[[], object], repeats: int) -> PairedTimes:
    """GPU time of a call of ``first`` and of ``second``, made in turn under one profiler, ``repeats``
    calls each (rounded up to even), so that the GPU's clocks drift alike for both: timed one after
    the other, a tie can read as a loss either way. The order is first, second, second, first, over
    and over, so each launch follows itself as often as it follows the other (what a kernel leaves in
    L2 can speed or slow the next). Each launch's work is told apart by the names of its kernels,
    learnt from a call of it alone; the two must share none."""
    names = []
    for launch in (first, second):
        launch()
        torch.cuda.synchronize()
        names.append(frozenset(event.name for event in _device_events([launch])))
    if names[0] & names[1] or not all(names):
        raise ValueError(f"the launches' kernels must differ by name: {sorted(names[0])} / {sorted(names[1])}")
    rounds = (repeats + 1) // 2
    events = _device_events([first, second, second, first] * rounds)
    return pair_times(events, names[0], names[1], 2 * rounds)


def pair_times(
    events: Sequence[DeviceEvent], first: frozenset[str], second: frozenset[str], repeats: int
) -> PairedTimes:
    """Split the events of ``repeats`` calls of two launches, made in turn, by kernel name into
    per-call times (the n-th call's events are the n-th run of its share, in start order)."""
    per_call = []
    for names in (first, second):
        durations = [event.elapsed_us for event in events if event.name in names]
        if not durations or len(durations) % repeats:
            raise RuntimeError(f"{len(durations)} events of {sorted(names)} in {repeats} calls: not as many per call")
        per = len(durations) // repeats
        per_call.append([sum(durations[i * per : (i + 1) * per]) for i in range(repeats)])
    differences = [a - b for a, b in zip(*per_call, strict=True)]
    spread = statistics.stdev(differences) if repeats > 1 else float("inf")
    return PairedTimes(statistics.fmean(per_call[0]), statistics.fmean(per_call[1]), 1.96 * spread / repeats**0.5)


# The sleep kernel's cycles per µs: at most about 2 GHz on the H100 and H200, so a sleep of N µs'
# worth of cycles lasts at least N µs.
_SLEEP_CYCLES_PER_US = 2000


def host_time_us(launch: Callable[[], object], repeats: int, *, busy_us: float | None = None) -> float:
    """Host µs of one call, median over ``repeats``; the GPU is idle before each (synchronised).

    With ``busy_us``, a sleep kernel that long (longer than the call) is queued before each call
    instead, so the call is made while the GPU is still busy, as the engine makes it: TensorRT-LLM
    calls the logits post-processor right after queuing the step's forward pass, which is still
    running. (On the H100 the two differed by about 1 µs, busy the slower: docs/kernel.md.)
    """
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if busy_us is not None:
            torch.cuda._sleep(int(busy_us * _SLEEP_CYCLES_PER_US))  # type: ignore[no-untyped-call]
        started = time.perf_counter()
        launch()
        times.append((time.perf_counter() - started) * 1e6)
        torch.cuda.synchronize()
    return float(statistics.median(times))


def _tenth_rows(batch: int) -> int:
    """Rows of a string's masks in a tenth or few batch: rows 0, 10, 20, ... of tenth."""
    return len(range(0, batch, 10))


def floor_us(kind: str, batch: int, vocab: int, dtype: torch.dtype, bandwidth: float) -> float:
    """The least memory traffic any kernel needs: read the masks; write (1 token) or read and write
    (50%) every logit; write half the rows' logits (mixed) or the refused ones (string, and the
    string rows' in tenth and few)."""
    item = torch.tensor([], dtype=dtype).element_size()
    mask_bytes = batch * ((vocab + 31) // 32) * 4
    logits_bytes = batch * vocab * item
    refused_bytes = batch * (vocab // STRING_REFUSED_EVERY) * item  # (at most: a token may be drawn twice)
    string_rows_traffic = mask_bytes + refused_bytes // batch * _tenth_rows(batch)  # (tenth and few)
    traffic = {
        "all": mask_bytes,
        "one": mask_bytes + logits_bytes,
        "half": mask_bytes + 2 * logits_bytes,
        "mixed": mask_bytes + logits_bytes // 2,
        "string": mask_bytes + refused_bytes,
        "tenth": string_rows_traffic,
        "few": string_rows_traffic,
    }[kind]
    return traffic / bandwidth * 1e6


def achievable_us(kind: str, logits: torch.Tensor, repeats: int) -> float | None:
    """The floor's traffic at the bandwidth this GPU really sustains, as torch's own kernels show it.

    torch's ``fill_`` (write every logit: the 1-token case) or in-place ``neg_`` (read and write
    every logit: the 50% case) is timed on the same logits; the mask bytes are charged at the
    bandwidth that kernel reached. None for all-allowed (reading the masks only: torch has no
    plain read-only kernel to compare with).
    """
    if kind not in ("one", "half"):
        return None
    scratch = logits.clone()
    logits_bytes = scratch.numel() * scratch.element_size()
    mask_bytes = len(scratch) * ((scratch.shape[-1] + 31) // 32) * 4
    if kind == "one":
        elapsed, moved = gpu_time_us(functools.partial(scratch.fill_, float("-inf")), repeats), logits_bytes
    else:
        elapsed, moved = gpu_time_us(scratch.neg_, repeats), 2 * logits_bytes
    return elapsed * (moved + mask_bytes) / moved


def check_equal(ours: torch.Tensor, reference: torch.Tensor, label: str) -> None:
    if not torch.equal(ours.view(torch.int16 if ours.element_size() == 2 else torch.int32),
                       reference.view(torch.int16 if reference.element_size() == 2 else torch.int32)):  # fmt: skip
        raise AssertionError(f"{label}: the kernel differs from the reference")


def measure_case(
    applier: CudaBitmaskApplier,
    logits: torch.Tensor,
    masks: torch.Tensor,
    xgrammar: dict[str, ModuleType | None],
    repeats: int,
    *,
    paired_repeats: int,
    calls_applier: CudaBitmaskApplier,
    planned_appliers: dict[LaunchPlan, CudaBitmaskApplier],
    variants: dict[str, CudaBitmaskApplier],
) -> dict[str, float]:
    """Check the kernel against the reference, then time every implementation on the same data."""
    stream_ptr = torch.cuda.current_stream().cuda_stream
    masks_gpu = masks.to(logits.device)
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, masks_gpu)
    work = logits.clone()
    applier.host_masks(len(masks)).copy_(masks)
    applier.apply(work, stream_ptr)
    torch.cuda.synchronize()
    check_equal(work, expected, f"{logits.dtype} {tuple(logits.shape)}")
    ours = functools.partial(applier.run_resident, work, stream_ptr)
    cuda, triton = xgrammar.get("cuda"), xgrammar.get("triton")
    # Ours alone, call after call (as torch's fill_ and neg_ are timed for the floor), and, against
    # xgrammar's CUDA kernel, the two timed in turn with the noise of their difference.
    row = {"ours_alone_us": gpu_time_us(ours, repeats)}
    if cuda is not None:
        paired = paired_gpu_time_us(
            ours, functools.partial(cuda.apply_token_bitmask_inplace_cuda, work, masks_gpu), paired_repeats
        )
        row["ours_us"], row["xgrammar_cuda_us"] = paired.first_us, paired.second_us
        row["ours_minus_xgrammar_ci_us"] = paired.difference_ci_us
    else:
        row["ours_us"] = row["ours_alone_us"]
    row |= {
        "plain_us": gpu_time_us(functools.partial(run_plain, applier, work, stream_ptr), repeats),
        "torch_us": gpu_time_us(functools.partial(apply_token_bitmask_cpu, work, masks_gpu), repeats),
    }
    # The host time in two forms: one tensor, and one [1, 1, vocab] view per request, as TensorRT-LLM
    # and the step scheduler hand them; each with the GPU idle and busy.
    forms = {
        "host": functools.partial(applier.apply, work, stream_ptr),
        "host_rows": functools.partial(applier.apply, [line.view(1, 1, -1) for line in work], stream_ptr),
    }
    for form, call in forms.items():
        row[f"{form}_us"] = host_time_us(call, repeats)
        row[f"{form}_busy_us"] = host_time_us(call, repeats, busy_us=_busy_us(row[f"{form}_us"]))
    torch.cuda.synchronize()
    check_equal(work, expected, "graph replays")  # the replays masked with the same masks again
    calls_applier.host_masks(len(masks)).copy_(masks)
    row["host_calls_us"] = host_time_us(functools.partial(calls_applier.apply, work, stream_ptr), repeats)
    # The same with the launch plan the masks' sample picks set beforehand: what the sample costs.
    # (A launch that has one layout takes it whatever the plan.)
    planned = planned_appliers[applier.launch_plan(work) or LaunchPlan.DENSE]
    planned.host_masks(len(masks)).copy_(masks)
    row["host_planned_us"] = host_time_us(functools.partial(planned.apply, work, stream_ptr), repeats)
    for label, variant in variants.items():
        check = logits.clone()
        variant.host_masks(len(masks)).copy_(masks)
        variant.apply(check, stream_ptr)
        torch.cuda.synchronize()
        check_equal(check, expected, f"variant {label}")
        row[f"variant_{label}_us"] = gpu_time_us(functools.partial(variant.run_resident, work, stream_ptr), repeats)
    if cuda is not None:
        call = functools.partial(cuda.apply_token_bitmask_inplace_cuda, work, masks_gpu)
        row["xgrammar_cuda_host_us"] = host_time_us(call, repeats)
        row["xgrammar_cuda_host_busy_us"] = host_time_us(call, repeats, busy_us=_busy_us(row["xgrammar_cuda_host_us"]))
        # What a caller of xgrammar's kernel pays per step when the masks start on the host, as ours do.
        pinned = masks.pin_memory()
        with_copy = functools.partial(_xgrammar_with_copy, cuda, work, pinned)
        row["xgrammar_cuda_copy_host_us"] = host_time_us(with_copy, repeats)
    if triton is not None:
        row["xgrammar_triton_us"] = gpu_time_us(
            functools.partial(triton.apply_token_bitmask_inplace_triton, work, masks_gpu), repeats
        )
    return row


def _busy_us(idle_host_us: float) -> float:
    """A sleep that outlasts a call whose host time, with the GPU idle, was ``idle_host_us``."""
    return 50.0 + 2 * idle_host_us


def _xgrammar_with_copy(kernel: ModuleType, logits: torch.Tensor, pinned_masks: torch.Tensor) -> None:
    kernel.apply_token_bitmask_inplace_cuda(logits, pinned_masks.to(logits.device, non_blocking=True))


@dataclass(frozen=True)
class Variant:
    """Our kernel built (``defines``) or launched (the policy's ``settings``) another way, timed beside
    the default."""

    label: str
    defines: tuple[str, ...] = ()
    settings: PolicySettings = field(default_factory=PolicySettings)

    def applier(self, device: torch.device, rows: int, vocab: int) -> CudaBitmaskApplier:
        return CudaBitmaskApplier(device, rows, vocab, settings=self.settings, defines=self.defines)


VARIANT_HELP = (
    "label:waves[:DEFINE,...[:FLAT_MIB[:THREADS[:SCATTER16_MIB[:WORDS_MIB[:FLAT_VECTORS[:GROUP_MIB[:PLAN"
    "[:FLAT_THREADS[:SCAN_PIECES]]]]]]]]]], "
    "e.g. ncs:auto:LLGT_STREAM_STORES=0 (repeatable)"
)


def parse_variant(text: str) -> Variant:
    """``label:waves[:DEFINE,...[:FLAT_MIB[:THREADS[:SCATTER16_MIB[:WORDS_MIB[:FLAT_VECTORS[:GROUP_MIB[:PLAN[:FLAT_THREADS[:SCAN_PIECES]]]]]]]]]]``,
    e.g. ``w1:1``, ``ncs:auto:LLGT_STREAM_STORES=0``, ``flat24:auto::24``, ``t128:auto:::128``,
    ``s64:auto::::64``, ``words24:auto:::::24``, ``v1:auto::::::1``, ``one:auto:::::::0``,
    ``dense:auto::::::::dense``, ``ft128:auto:::::::::128`` or ``sp1:auto::::::::::1``
    (auto: waves by launch size;
    FLAT_MIB: the largest small launch (a few vectors per thread); THREADS: threads per block of the
    chunked kernels; SCATTER16_MIB: the largest 16-bit launch that scatters into mixed vectors;
    WORDS_MIB: the mid-size bound: the largest 16-bit launch above FLAT_MIB of one warp per chunk,
    every chunk at once, and the largest aligned fp32 one that takes the refused plan;
    FLAT_VECTORS: 16-byte vectors per thread of fp32 small launches, 1 or 2, instead of by size;
    GROUP_MIB: chunked launches whose masks exceed it run as row groups whose masks fit, one launch
    each; 0: one launch whatever the masks' size; PLAN: dense, sparse, patchy or refused, every
    chunked or small launch laid out so instead of by a sample of its masks; launches that have no
    refused plan (fp32 small ones but those of two vectors per thread whose one-vector grid takes 1 to
    1.5 waves, unaligned ones, and all above the mid-size bound) take dense for it; FLAT_THREADS:
    threads per block of the small-launch kernels, a multiple of 32 up to their build's bound: 256,
    or LLGT_FLAT_BOUNDS among the DEFINEs; SCAN_PIECES: pieces of mask
    words each warp of the sparse plan's kernel takes before its grid grows, up to all the blocks the
    SMs hold)."""
    label, waves, *rest = text.split(":")
    defines = tuple(d for d in (rest[0].split(",") if rest else []) if d)
    default = PolicySettings()

    def part(index: int) -> str:
        return rest[index] if len(rest) > index else ""

    group = part(6)
    settings = PolicySettings(
        waves=None if waves == "auto" else float(waves),
        flat_max_bytes=int(part(1)) << 20 if part(1) else default.flat_max_bytes,
        chunk_threads=int(part(2)) if part(2) else default.chunk_threads,
        scatter16_max_bytes=int(part(3)) << 20 if part(3) else None,
        words_max_bytes=int(part(4)) << 20 if part(4) else default.words_max_bytes,
        flat_per_thread=int(part(5)) if part(5) else None,
        group_mask_bytes=(int(group) << 20 or None) if group else GROUP_MASK_BYTES,
        plan=LaunchPlan(part(7)) if part(7) else None,
        flat_threads=int(part(8)) if part(8) else default.flat_threads,
        scan_warp_pieces=int(part(9)) if part(9) else default.scan_warp_pieces,
    )
    return Variant(label, defines, settings)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 4096])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 128256, 151936])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--kinds", nargs="+", default=["all", "half", "one"], choices=MASK_KINDS)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--paired-repeats",
        type=int,
        default=200,
        help="calls of ours and of xgrammar's CUDA kernel, in turn, that time the two side by side",
    )
    parser.add_argument("--xgrammar", type=Path, help="unpacked xgrammar wheel (its kernels/ folder)")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="mask_kernel", help="the report is <out>/<name>.json")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=parse_variant,
        help=f"also time a variant of our kernel: {VARIANT_HELP}",
    )
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    bandwidth = next((value for key, value in BANDWIDTH.items() if key in name), 3.35e12)
    xgrammar: dict[str, ModuleType | None] = {}
    if arguments.xgrammar is not None:
        kernels = arguments.xgrammar / "xgrammar" / "kernels"
        started = time.perf_counter()
        xgrammar["cuda"] = load_module(kernels / "apply_token_bitmask_inplace_cuda.py", "xgr_cuda")
        logger.info("xgrammar CUDA kernel loaded in %.0f s", time.perf_counter() - started)
        xgrammar["triton"] = load_module(kernels / "apply_token_bitmask_inplace_triton.py", "xgr_triton")
    generator = torch.Generator().manual_seed(0)
    results: list[dict[str, Any]] = []
    for vocab in arguments.vocabs:
        applier = CudaBitmaskApplier(device, max(arguments.batches), vocab, defines=[PLAIN_KERNELS])
        calls_applier = CudaBitmaskApplier(device, max(arguments.batches), vocab, graphs=False)
        planned = {
            plan: CudaBitmaskApplier(device, max(arguments.batches), vocab, settings=PolicySettings(plan=plan))
            for plan in LaunchPlan
        }
        variants = {v.label: v.applier(device, max(arguments.batches), vocab) for v in arguments.variant}
        logger.info("registers per thread: %s", applier.registers())
        for dtype_name in arguments.dtypes:
            for batch in arguments.batches:
                logits = torch.randn((batch, vocab), device=device).to(DTYPES[dtype_name])
                for kind in arguments.kinds:
                    row: dict[str, Any] = {"vocab": vocab, "dtype": dtype_name, "batch": batch, "kind": kind}
                    masks = make_masks(kind, batch, vocab, generator)
                    row.update(
                        measure_case(
                            applier,
                            logits,
                            masks,
                            xgrammar,
                            arguments.repeats,
                            paired_repeats=arguments.paired_repeats,
                            calls_applier=calls_applier,
                            planned_appliers=planned,
                            variants=variants,
                        )
                    )
                    row["floor_us"] = floor_us(kind, batch, vocab, DTYPES[dtype_name], bandwidth)
                    achievable = achievable_us(kind, logits, arguments.repeats)
                    if achievable is not None:
                        row["achievable_us"] = achievable
                        row["ours_vs_achievable"] = row["ours_alone_us"] / achievable
                    row["ours_vs_floor"] = row["ours_alone_us"] / row["floor_us"]
                    results.append(row)
                    logger.info("%s", json.dumps(row))
                del logits
    report = {"device": name, "host_cpu": host_cpu(), "bandwidth": bandwidth, "results": results}
    write_report(arguments.out / f"{arguments.name}.json", report)


if __name__ == "__main__":
    main()
