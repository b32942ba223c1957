"""The CUDA bitmask kernel against the CPU reference, bit for bit (GPU machine only).

Run there with ``python -m pytest -c /dev/null --confcutdir=tests/gpu tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

from backend.kernels.catalog import named
from backend.masking import apply_token_bitmask_cpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
]

VOCABS = [32001, 49152, 128256, 151936]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KINDS = ["random", "all", "none", "one"]


def masks(kind: str, rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    words = (vocab + 31) // 32
    if kind == "all":
        return torch.full((rows, words), -1, dtype=torch.int32)
    if kind == "none":
        return torch.zeros((rows, words), dtype=torch.int32)
    if kind == "one":
        out = torch.zeros((rows, words), dtype=torch.int32)
        for row, token in enumerate(torch.randint(0, vocab, (rows,), generator=generator).tolist()):
            out[row, token >> 5] = torch.tensor(1 << (token & 31)).to(torch.int32)
        return out
    # random words, with some all-allowed and all-disallowed words mixed in
    out = torch.randint(-(2**31), 2**31, (rows, words), generator=generator, dtype=torch.int64).to(torch.int32)
    out[:, ::7] = -1
    out[:, 3::11] = 0
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int16 if a.element_size() == 2 else torch.int32
    return torch.equal(a.contiguous().view(view).cpu(), b.contiguous().view(view).cpu())


def masks_like_the_reference(
    applier: object, mask: torch.Tensor, dtype: torch.dtype, generator: torch.Generator
) -> bool:
    """Random ``[rows, vocab]`` logits masked with ``mask`` by ``applier`` (one tensor, on the current
    stream), bit for bit as the CPU reference masks them."""
    rows, vocab = len(mask), applier.vocab_size  # type: ignore[attr-defined]
    logits = torch.randn((rows, vocab), generator=generator).to(dtype)
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, mask)
    gpu = logits.cuda()
    applier.host_masks(rows).copy_(mask)  # type: ignore[attr-defined]
    applier.apply(gpu, torch.cuda.current_stream().cuda_stream)  # type: ignore[attr-defined]
    return same_bits(gpu, expected)


@pytest.fixture(scope="module")
def appliers() -> dict[int, object]:
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    return {vocab: CudaBitmaskApplier(torch.device("cuda"), 16, vocab) for vocab in VOCABS}


# Small batches take the one-vector-per-thread kernel; these force the chunked kernel onto the same
# cases, each build named with its scatter16_max_bytes and launch plan: as launches that fit in L2
# take it (16-bit mixed vectors scattered into), and as larger 16-bit launches take it (mixed vectors
# read, selected and written back); with the plan a sample of the masks picks (sparse for "all",
# dense for the others), and with each plan forced onto every kind of mask. The "words" build makes
# every launch mid-size: 16-bit ones take the one-warp-per-chunk kernel, aligned fp32 ones the
# chunked kernel, or the two-vector small-launch kernel when their masks allow (nearly) nothing,
# unaligned ones the chunked kernel; "words_refused" forces that refused plan onto every kind of
# mask (16-bit launches have one layout there). The "flat_x2" build gives the fp32 small-launch kernel two vectors per
# thread; "flat_sparse", "flat_dense" and "flat_refused" force each plan onto the small launches (the
# sparse one takes the one-warp-per-chunk kernel, of every dtype, which the default picks for "all";
# the refused one never reads a refused logit, which the default picks for 16-bit "none" and "one";
# fp32 launches take the dense plan for it; "flat_patchy" and "chunked_patchy" force the plan of a
# batch with a few constrained rows: small launches load only mask words, 16-bit chunked ones take
# the one-warp-per-chunk kernel, aligned fp32 ones the dense plan, unaligned ones the sparse layout);
# "flat_t64_x2" and "flat_t32_refused" launch small-launch
# blocks of 64 and 32 threads (more blocks per row, the last one partly past the row). The
# "grouped" build runs the chunked kernel as dense-plan row groups of two rows' masks (one launch
# per group), as launches whose masks exceed GROUP_MASK_BYTES run. "chunked_sparse_spread" gives
# the sparse plan's kernel one piece of mask words per warp (as patchy steps past patchy_launch's
# sizes take it) instead of the fewest blocks whose warps read every piece in one round.
CHUNKED_BUILDS: dict[str, tuple[int | None, str | None, int | None]] = {
    "chunked": (None, None, None),
    "chunked_read": (0, None, None),
    "chunked_sparse": (None, "sparse", None),
    "chunked_sparse_spread": (None, "sparse", 1),
    "chunked_read_sparse": (0, "sparse", None),
    "chunked_dense": (None, "dense", None),
    "chunked_patchy": (None, "patchy", None),
}
FLAT_BUILDS: dict[str, tuple[int | None, str | None, int]] = {
    "flat_x2": (2, None, 256),
    "flat_sparse": (None, "sparse", 256),
    "flat_dense": (None, "dense", 256),
    "flat_refused": (None, "refused", 256),
    "flat_patchy": (None, "patchy", 256),
    "flat_t64_x2": (2, None, 64),
    "flat_t32_refused": (None, "refused", 32),
}


@pytest.fixture(scope="module")
def builds(appliers: dict[int, object]) -> dict[tuple[str, int], object]:
    """``(build, vocab)``: the default appliers, and the chunked builds forced onto small batches."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import SCAN_WARP_PIECES, LaunchPlan, PolicySettings

    chunked = {
        (build, vocab): CudaBitmaskApplier(
            torch.device("cuda"),
            16,
            vocab,
            settings=PolicySettings(
                flat_max_bytes=0,
                scatter16_max_bytes=scatter16_max_bytes,
                words_max_bytes=0,
                plan=None if plan is None else LaunchPlan(plan),
                scan_warp_pieces=SCAN_WARP_PIECES if warp_pieces is None else warp_pieces,
            ),
        )
        for build, (scatter16_max_bytes, plan, warp_pieces) in CHUNKED_BUILDS.items()
        for vocab in VOCABS
    }
    words = {
        (build, vocab): CudaBitmaskApplier(
            torch.device("cuda"),
            16,
            vocab,
            settings=PolicySettings(flat_max_bytes=0, words_max_bytes=1 << 40, plan=plan),
        )
        for build, plan in (("words", None), ("words_refused", LaunchPlan.REFUSED))
        for vocab in VOCABS
    }
    flat = {
        (build, vocab): CudaBitmaskApplier(
            torch.device("cuda"),
            16,
            vocab,
            settings=PolicySettings(
                flat_per_thread=per_thread, plan=None if plan is None else LaunchPlan(plan), flat_threads=threads
            ),
        )
        for build, (per_thread, plan, threads) in FLAT_BUILDS.items()
        for vocab in VOCABS
    }
    grouped = {
        ("grouped", vocab): CudaBitmaskApplier(
            torch.device("cuda"),
            16,
            vocab,
            settings=PolicySettings(
                flat_max_bytes=0, words_max_bytes=0, group_mask_bytes=(vocab + 31) // 32 * 8, plan=LaunchPlan.DENSE
            ),
        )
        for vocab in VOCABS
    }
    default = {("default", vocab): applier for vocab, applier in appliers.items()}
    return {**default, **chunked, **words, **flat, **grouped}


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("build", ["default", *CHUNKED_BUILDS, "words", "words_refused", *FLAT_BUILDS, "grouped"])
def test_kernel_matches_the_reference(
    builds: dict[tuple[str, int], object], vocab: int, dtype: torch.dtype, kind: str, build: str
) -> None:
    applier = builds[(build, vocab)]
    generator = torch.Generator().manual_seed(vocab + len(kind))
    mask = masks(kind, 5, vocab, generator)
    logits = torch.randn((5, vocab), generator=generator).to(dtype)
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, mask)
    gpu = logits.cuda()
    applier.host_masks(5).copy_(mask)  # type: ignore[attr-defined]
    applier.apply(gpu, torch.cuda.current_stream().cuda_stream)  # type: ignore[attr-defined]
    assert same_bits(gpu, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_launch_blocks_above_256_threads_need_the_build_that_allows_them(dtype: torch.dtype) -> None:
    """The small-launch kernels are built for blocks of at most 256 threads: more is refused when the
    applier is made, not at the first launch; LLGT_FLAT_BOUNDS=1024 builds them for 1024, which mask
    as the reference does."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import PolicySettings

    vocab, rows = 151936, 8
    with pytest.raises(ValueError, match="LLGT_FLAT_BOUNDS"):
        CudaBitmaskApplier(torch.device("cuda"), rows, vocab, settings=PolicySettings(flat_threads=512))
    applier = CudaBitmaskApplier(
        torch.device("cuda"),
        rows,
        vocab,
        settings=PolicySettings(flat_threads=1024),
        defines=("LLGT_FLAT_BOUNDS=1024",),
    )
    generator = torch.Generator().manual_seed(5)
    mask = masks("random", rows, vocab, generator)
    mask[::2] = 0
    mask[::2, 9] = 1 << 3  # half the rows allow one token (the refused plan, for 16-bit rows)
    assert masks_like_the_reference(applier, mask, dtype, generator)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_small_fp32_launch_of_most_of_a_wave_takes_two_vectors_per_thread(
    appliers: dict[int, object], dtype: torch.dtype
) -> None:
    """Rows enough for more than a wave of one-vector threads (8 blocks of 256 per SM), under the
    small-launch size: fp32 threads take two vectors each, 16-bit ones (which read theirs) one."""
    vocab = 32001
    applier = appliers[vocab]
    item = torch.tensor([], dtype=dtype).element_size()
    one_vector = {torch.float32: "flat_f32_v4", torch.float16: "flat_f16_v8", torch.bfloat16: "flat_bf16_v8"}[dtype]
    rows = applier.policy.flat_rows_within(named(one_vector), 1.0) + 2  # type: ignore[attr-defined]
    assert rows * vocab * item <= 8 << 20  # still a small launch
    generator = torch.Generator().manual_seed(4)
    mask = masks("random", rows, vocab, generator)
    mask[::3] = -1  # some rows allow everything, some one token
    mask[1::3] = 0
    mask[1::3, 7] = 1 << 5
    logits = torch.randn((rows, vocab), generator=generator).to(dtype)
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, mask)
    gpu = torch.zeros((rows, vocab + 7), dtype=dtype, device="cuda")[:, :vocab]  # 16-byte aligned rows
    gpu.copy_(logits.cuda())
    applier.host_masks(rows).copy_(mask)  # type: ignore[attr-defined]
    name = applier.policy.kernel(dtype, aligned=True, rows=rows).name  # type: ignore[attr-defined]
    applier.apply(gpu, torch.cuda.current_stream().cuda_stream)  # type: ignore[attr-defined]
    assert (
        name == {torch.float32: "flat_f32_v4_x2", torch.float16: "flat_f16_v8", torch.bfloat16: "flat_bf16_v8"}[dtype]
    )
    assert same_bits(gpu, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sparse_plan_small_launch_masks_every_chunk_however_few_waves_the_chunked_kernels_take(
    dtype: torch.dtype,
) -> None:
    """The one-warp-per-chunk kernel covers each chunk once, so its grid must not follow the
    chunked kernels' waves (fixed low here, as a benchmark variant or a GPU with few SMs has them)."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import LaunchPlan, PolicySettings

    vocab, rows = 151936, 8
    settings = PolicySettings(waves=0.01, plan=LaunchPlan.SPARSE)
    applier = CudaBitmaskApplier(torch.device("cuda"), rows, vocab, settings=settings)
    generator = torch.Generator().manual_seed(3)
    assert masks_like_the_reference(applier, masks("random", rows, vocab, generator), dtype, generator)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("small", [True, False], ids=["small", "chunked"])
def test_a_batch_with_a_few_constrained_rows_masks_like_the_reference(
    vocab: int, dtype: torch.dtype, small: bool
) -> None:
    """The sample of such a batch's masks finds it patchy (most runs allow everything, some do not),
    and the launch it picks masks the constrained rows and leaves the others alone."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import PolicySettings
    from backend.kernels.mask_probe import PATCHY, REFUSED_FROM, MaskDensityProbe

    rows = 16
    settings = PolicySettings(flat_max_bytes=(8 << 20) if small else 0)
    applier = CudaBitmaskApplier(torch.device("cuda"), rows, vocab, settings=settings)
    generator = torch.Generator().manual_seed(vocab)
    mask = torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32)
    mask[[3, 11]] = masks("random", 2, vocab, generator)
    assert MaskDensityProbe(mask.numpy().reshape(-1), mask.shape[1]).plan(rows, REFUSED_FROM) == PATCHY
    assert masks_like_the_reference(applier, mask, dtype, generator)


@pytest.mark.parametrize("kind", KINDS)
def test_a_mid_size_fp32_launch_whose_masks_allow_nothing_takes_the_two_vector_small_launch_kernel(kind: str) -> None:
    """Over the small-launch size, under the mid-size one: masks that allow nothing or one token a
    row take the refused plan, two vectors per small-launch thread; the others the chunked kernel
    (sparse for "all", dense for "random"). Each masks as the reference does."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import FLAT_MAX_BYTES, WORDS_MAX_BYTES

    vocab, rows = 151936, 16
    applier = CudaBitmaskApplier(torch.device("cuda"), rows, vocab)
    assert FLAT_MAX_BYTES < rows * vocab * 4 <= WORDS_MAX_BYTES
    generator = torch.Generator().manual_seed(6)
    mask = masks(kind, rows, vocab, generator)
    assert masks_like_the_reference(applier, mask, torch.float32, generator)
    assert applier.policy.kernel(torch.float32, True, rows).name == "mask_f32_v4"  # (before the plan's)
    plan = applier.launch_plan(torch.empty((rows, vocab), device="cuda"))
    expected = {"none": "refused", "one": "refused", "all": "sparse", "random": "dense"}[kind]
    assert plan is not None and plan.value == expected
    assert applier.last_launch is not None and applier.last_launch.plan == plan
    assert (applier.last_launch.kernel.name == "flat_f32_v4_x2") == (plan.value == "refused")


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_small_launches_just_over_a_wave_of_one_vector_blocks_take_one_vector_when_masks_allow_nothing(
    kind: str,
) -> None:
    """fp32 small launches whose one-vector grid takes one to 1.5 waves: masks that allow nothing or
    one token a row take the refused plan, one vector per thread; the others two ("random", dense)
    or the one-warp-per-chunk kernel ("all", sparse). Just under a wave and past 1.5 waves, masks
    that allow nothing take two vectors too. Each launch masks as the reference does."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import FLAT_MAX_BYTES

    vocab = 151936
    policy = CudaBitmaskApplier(torch.device("cuda"), 1, vocab).policy
    one_vector = named("flat_f32_v4")
    one_wave, band_end = policy.flat_rows_within(one_vector, 1.0), policy.flat_rows_within(one_vector, 1.5)
    assert 0 < one_wave < band_end and (band_end + 1) * vocab * 4 <= FLAT_MAX_BYTES
    outside = "words_f32" if kind == "all" else "flat_f32_v4_x2"
    inside = {"none": "flat_f32_v4", "one": "flat_f32_v4"}.get(kind, outside)
    for rows, kernel in ((one_wave, outside), (one_wave + 1, inside), (band_end + 1, outside)):
        applier = CudaBitmaskApplier(torch.device("cuda"), rows, vocab)
        generator = torch.Generator().manual_seed(rows)
        assert masks_like_the_reference(applier, masks(kind, rows, vocab, generator), torch.float32, generator)
        assert applier.last_launch is not None and applier.last_launch.kernel.name == kernel, (
            rows,
            applier.last_launch,
        )


def test_the_one_vector_kernels_fit_a_wave_of_eight_blocks_per_sm(appliers: dict[int, object]) -> None:
    """The choice of two vectors per thread counts 8 blocks of 256 threads per SM: 32 registers at most."""
    registers = appliers[32001].registers()  # type: ignore[attr-defined]
    assert all(registers[name] <= 32 for name in ("flat_f32_v4", "flat_f16_v8", "flat_bf16_v8")), registers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_launch_that_prefetches_its_masks_into_l2_masks_like_the_reference(
    appliers: dict[int, object], dtype: torch.dtype
) -> None:
    """Over 128 MiB of logits with under 16 MiB of masks, dense: the grid prefetches every mask line first."""
    from backend.kernels.launch_policy import GROUP_MASK_BYTES, PREFETCH_MIN_LOGITS_BYTES

    vocab = 128256
    rows = (160 << 20) // (vocab * torch.tensor([], dtype=dtype).element_size()) + 1
    applier = appliers[vocab]
    generator = torch.Generator().manual_seed(3)
    mask = masks("random", rows, vocab, generator)
    logits = torch.randn((rows, vocab), device="cuda", dtype=dtype)
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, mask.cuda())
    applier.host_masks(rows).copy_(mask)  # type: ignore[attr-defined]
    applier.apply(logits, torch.cuda.current_stream().cuda_stream)  # type: ignore[attr-defined]
    assert rows * vocab * logits.element_size() > PREFETCH_MIN_LOGITS_BYTES and mask.numel() * 4 <= GROUP_MASK_BYTES
    launch = applier.last_launch  # type: ignore[attr-defined]
    assert launch.prefetch and not launch.groups
    assert same_bits(logits, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_launch_whose_masks_exceed_the_prefetch_limit_runs_as_row_groups_that_each_prefetch(
    dtype: torch.dtype,
) -> None:
    """Over 16 MiB of masks: three launches of under 16 MiB of masks and over 128 MiB of logits each
    (the prefetch thresholds), replayed from one graph on the second step."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.kernels.launch_policy import GROUP_MASK_BYTES

    vocab = 151936
    words = (vocab + 31) // 32
    rows = 2 * (GROUP_MASK_BYTES // (words * 4)) + 5
    applier = CudaBitmaskApplier(torch.device("cuda"), rows, vocab)
    groups = applier.policy.row_groups(rows)
    assert [first for first, _ in groups] == [0, groups[0][1], 2 * groups[0][1]]
    assert sum(count for _, count in groups) == rows
    assert max(count for _, count in groups) * words * 4 <= 16 << 20
    assert min(count for _, count in groups) * vocab * torch.tensor([], dtype=dtype).element_size() > 128 << 20
    generator = torch.Generator().manual_seed(5)
    logits = torch.empty((rows, vocab), device="cuda", dtype=dtype)
    for step, kind in enumerate(["random", "one"]):
        mask = masks(kind, rows, vocab, generator)
        mask[::5] = -1  # some rows allow everything
        logits.copy_(torch.randn((rows, vocab), generator=generator).to(dtype))
        expected = logits.clone()
        apply_token_bitmask_cpu(expected, mask.cuda())
        applier.host_masks(rows).copy_(mask)
        applier.apply(logits, torch.cuda.current_stream().cuda_stream)
        assert same_bits(logits, expected), f"step {step}"
        assert applier.last_launch is not None and applier.last_launch.groups == tuple(groups)
    assert applier.captured_shapes == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", ["default", *CHUNKED_BUILDS, "words", "words_refused", *FLAT_BUILDS, "grouped"])
def test_strided_beam_views_leave_the_padding_alone(
    builds: dict[tuple[str, int], object], dtype: torch.dtype, build: str
) -> None:
    vocab, padded = 32001, 32064
    applier = builds[(build, vocab)]
    generator = torch.Generator().manual_seed(1)
    mask = masks("random", 6, vocab, generator)
    full = torch.randn((3, 2, padded), generator=generator).to(dtype)
    expected = full.clone()
    apply_token_bitmask_cpu(expected[..., :vocab], mask.view(3, 2, -1))
    gpu = full.cuda()
    applier.host_masks(6).copy_(mask)  # type: ignore[attr-defined]
    applier.apply(gpu[..., :vocab], torch.cuda.current_stream().cuda_stream)  # type: ignore[attr-defined]
    assert same_bits(gpu, expected)  # the padded columns are untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", ["default", *CHUNKED_BUILDS, "words", "words_refused", "grouped"])
def test_per_request_tensors_on_a_side_stream(
    builds: dict[tuple[str, int], object], dtype: torch.dtype, build: str
) -> None:
    """TensorRT-LLM's form: one [1, 1, V] tensor per request, some unaligned, on a non-default stream."""
    vocab = 49152
    applier = builds[(build, vocab)]
    generator = torch.Generator().manual_seed(2)
    mask = masks("random", 4, vocab, generator)
    storage = torch.randn((4 * vocab + 3,), generator=generator).to(dtype)
    rows = [storage[1 + i * vocab : 1 + (i + 1) * vocab].view(1, 1, vocab) for i in range(4)]  # not 16-byte aligned
    expected = [row.clone() for row in rows]
    for index, row in enumerate(expected):
        apply_token_bitmask_cpu(row, mask[index])
    gpu_storage = storage.cuda()
    gpu_rows = [gpu_storage[1 + i * vocab : 1 + (i + 1) * vocab].view(1, 1, vocab) for i in range(4)]
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(side):
        gpu_storage.mul_(1.0)  # pending work on the stream the kernel must wait for
        applier.host_masks(4).copy_(mask)  # type: ignore[attr-defined]
        applier.apply(gpu_rows, side.cuda_stream)  # type: ignore[attr-defined]
    side.synchronize()
    assert all(same_bits(g, e) for g, e in zip(gpu_rows, expected, strict=True))


# Graphs a six-step run captures, by dtype and rows (128k vocabulary: small launches but for 32 rows
# of fp32, a mid-size launch). The steps whose masks allow everything (steps 1 and 5) take the
# sparse plan, the others the dense one: a graph each. 16-bit small launches and mid-size fp32 ones
# take the refused plan for the steps that allow nothing or one token (steps 2 and 3): a third graph.
REPLAY_GRAPHS = {(torch.float32, 6): 2, (torch.bfloat16, 6): 3, (torch.float32, 32): 3, (torch.bfloat16, 32): 3}


@pytest.mark.parametrize(("dtype", "rows"), REPLAY_GRAPHS)
@pytest.mark.parametrize("form", ["tensor", "per-request rows"])
def test_repeated_steps_replay_one_captured_graph_with_each_steps_masks_and_rows(
    form: str, dtype: torch.dtype, rows: int
) -> None:
    """From the second step of a shape on, the copy, event and launch are one graph replay; each
    replay must still use that step's masks and, for per-request rows, that step's row addresses
    (one graph per launch plan the steps take: REPLAY_GRAPHS)."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    vocab = 128256
    applier = CudaBitmaskApplier(torch.device("cuda"), 32, vocab)
    generator = torch.Generator().manual_seed(rows)
    stream = torch.cuda.current_stream().cuda_stream
    # The tensor form reuses one buffer, as an engine would.
    fixed = torch.empty((rows, vocab), device="cuda", dtype=dtype)
    for step in range(6):
        mask = masks(KINDS[step % len(KINDS)], rows, vocab, generator)
        logits = torch.randn((rows, vocab), generator=generator).to(dtype)
        expected = logits.clone()
        apply_token_bitmask_cpu(expected, mask)
        gpu = fixed.copy_(logits) if form == "tensor" else logits.cuda()  # new row addresses every step
        applier.host_masks(rows).copy_(mask)
        applier.apply(gpu if form == "tensor" else [gpu[i].view(1, 1, vocab) for i in range(rows)], stream)
        assert same_bits(gpu, expected), f"step {step}"
    assert applier.captured_shapes == REPLAY_GRAPHS[(dtype, rows)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chosen_rows_of_a_step_are_masked_and_the_others_left_bit_for_bit(dtype: torch.dtype) -> None:
    """A step whose batch mixes constrained and free requests masks only the constrained rows of the
    engine's one tensor, evenly spaced or not, from the same buffer step after step (graph replays)."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    vocab, batch = 128256, 8
    applier = CudaBitmaskApplier(torch.device("cuda"), batch, vocab)
    generator = torch.Generator().manual_seed(8)
    stream = torch.cuda.current_stream().cuda_stream
    fixed = torch.empty((batch, vocab), device="cuda", dtype=dtype)
    chosen_by_step = [[0, 2, 3, 7], [1, 3, 5, 7], [6], [0, 2, 3, 7], [1, 3, 5, 7], [7, 0]]
    for step, chosen in enumerate(chosen_by_step):
        mask = masks("random", len(chosen), vocab, generator)  # one kind: the same plan for the same rows
        logits = torch.randn((batch, vocab), generator=generator).to(dtype)
        expected = logits.clone()
        for index, row in enumerate(chosen):
            apply_token_bitmask_cpu(expected[row], mask[index])
        fixed.copy_(logits)
        applier.host_masks(len(chosen)).copy_(mask)
        applier.apply(fixed, stream, rows=chosen)
        assert same_bits(fixed, expected), f"step {step}, rows {chosen}"
    assert applier.captured_shapes >= 1  # the repeated choices replay their graphs


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_plain_comparison_kernel_is_built_only_for_benchmarks(
    appliers: dict[int, object], dtype: torch.dtype
) -> None:
    """The benchmark's plain kernel (bench/plain_kernel.py) is in no serving build, and masks as the
    reference does in the build that has it."""
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from bench.plain_kernel import PLAIN_KERNELS, run_plain

    vocab, rows = 32001, 3
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises(RuntimeError, match="cuModuleGetFunction"):
        run_plain(appliers[vocab], torch.zeros((rows, vocab), device="cuda", dtype=dtype), stream)  # type: ignore[arg-type]
    bench_applier = CudaBitmaskApplier(torch.device("cuda"), rows, vocab, defines=[PLAIN_KERNELS])
    generator = torch.Generator().manual_seed(9)
    mask = masks("random", rows, vocab, generator)
    logits = torch.randn((rows, vocab), generator=generator).to(dtype)
    expected = logits.clone()
    apply_token_bitmask_cpu(expected, mask)
    bench_applier.host_masks(rows).copy_(mask)
    bench_applier.apply(torch.zeros((rows, vocab), device="cuda", dtype=dtype), stream)  # the masks to the device
    gpu = logits.cuda()
    run_plain(bench_applier, gpu, stream)
    assert same_bits(gpu, expected)


def test_a_larger_batch_reallocates_and_drops_the_graphs() -> None:
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    vocab = 32001
    applier = CudaBitmaskApplier(torch.device("cuda"), 2, vocab)
    generator = torch.Generator().manual_seed(3)
    stream = torch.cuda.current_stream().cuda_stream
    for rows in (2, 2, 2, 7, 7, 7):
        mask = masks("random", rows, vocab, generator)
        logits = torch.randn((rows, vocab), generator=generator)
        expected = logits.clone()
        apply_token_bitmask_cpu(expected, mask)
        gpu = logits.cuda()
        applier.host_masks(rows).copy_(mask)
        applier.apply([gpu[i] for i in range(rows)], stream)
        assert same_bits(gpu, expected), f"{rows} rows"
    assert applier.captured_shapes == 1  # the 7-row shape; the 2-row graph went with the old buffers


def test_without_graphs_every_step_is_three_calls() -> None:
    from backend.kernels.cuda_masking import CudaBitmaskApplier

    vocab = 49152
    applier = CudaBitmaskApplier(torch.device("cuda"), 4, vocab, graphs=False)
    generator = torch.Generator().manual_seed(4)
    gpu = torch.empty((4, vocab), device="cuda")
    for _ in range(3):
        mask = masks("random", 4, vocab, generator)
        logits = torch.randn((4, vocab), generator=generator)
        expected = logits.clone()
        apply_token_bitmask_cpu(expected, mask)
        gpu.copy_(logits)
        applier.host_masks(4).copy_(mask)
        applier.apply(gpu, torch.cuda.current_stream().cuda_stream)
        assert same_bits(gpu, expected)
    assert applier.captured_shapes == 0


def test_wrong_rows_are_refused(appliers: dict[int, object]) -> None:
    applier = appliers[49152]
    with pytest.raises(ValueError, match="49152"):
        applier.apply(torch.zeros((2, 100), device="cuda"), 0)  # type: ignore[attr-defined]


def _request_rows(vocab: int, count: int) -> list[torch.Tensor]:
    return [row.view(1, 1, -1) for row in torch.zeros((count, vocab), device="cuda")]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda v: torch.zeros((1, 2, v), device="cuda"), r"row 2 .* \[1, 2, 49152\]"),  # two beams, one mask
        (lambda v: torch.zeros((1, 1, v), device="cuda", dtype=torch.float16), "row 2 .* of torch.float16 on cuda"),
        (lambda v: torch.zeros((1, 1, 2 * v), device="cuda")[..., ::2], r"row 2 .* strides \(98304, 98304, 2\)"),
        (lambda v: torch.zeros((1, 1, v)), "row 2 .* on cpu"),
        (lambda v: torch.zeros((1, 1, v + 1), device="cuda"), r"row 2 .* \[1, 1, 49153\]"),
    ],
)
def test_a_wrong_request_tensor_among_the_rows_is_refused_by_its_index_and_masks_nothing(
    appliers: dict[int, object], bad: object, message: str
) -> None:
    """Every per-request tensor must be one row like the first: a tensor of two beams has one mask,
    and masking its first row only would drop the constraint on the second."""
    applier = appliers[49152]
    rows = _request_rows(49152, 4)
    rows[2] = bad(49152)  # type: ignore[operator]
    applier.host_masks(4).zero_()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=message):
        applier.apply(rows, torch.cuda.current_stream().cuda_stream)  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    assert all(not row.isinf().any() for row in rows if row.is_cuda)


def test_a_first_request_tensor_of_two_rows_is_refused(appliers: dict[int, object]) -> None:
    applier = appliers[49152]
    with pytest.raises(ValueError, match=r"row 0 .* \[1, 2, 49152\]"):
        applier.apply([torch.zeros((1, 2, 49152), device="cuda")], 0)  # type: ignore[attr-defined]


def test_the_batched_hook_masks_padded_tensorrt_llm_rows_with_the_kernel() -> None:
    """An engine on TP 2 with an odd vocabulary hands the hook [1, 1, vocab + 1] rows on its stream."""
    import llguidance

    from backend.constraints import GuidanceLogitsProcessor
    from backend.kernels.cuda_masking import CudaBitmaskApplier
    from backend.trtllm.hooks import BatchedHook

    tokenizer = llguidance.LLTokenizer("byte")
    vocab = tokenizer.vocab_size
    applier = CudaBitmaskApplier(torch.device("cuda"), 4, vocab)
    processor = GuidanceLogitsProcessor(tokenizer, vocab, 4, applier=applier)
    grammar = llguidance.grammar_from("regex", "[0-9]+")
    processor.add(11, llguidance.LLMatcher(tokenizer, grammar), prompt_length=1)
    hook = BatchedHook(processor, eos_token_ids=tokenizer.eos_tokens)
    rows = [torch.zeros((1, 1, vocab + 1), device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    hook([1, 2], rows, [[[65]], [[66]]], side.cuda_stream, [11, None])
    side.synchronize()
    assert hook.error(11) is None
    allowed = (rows[0][0, 0] == 0).nonzero().flatten().tolist()
    assert allowed == list(tokenizer.tokenize_str("0123456789"))  # the digits' byte tokens, nothing else
    assert rows[0][0, 0, vocab] == float("-inf") and rows[1][0, 0, vocab] == float("-inf")
    assert torch.all(rows[1][0, 0, :vocab] == 0)  # the unconstrained row keeps its logits
