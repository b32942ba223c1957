"""Triton python backend adapter for llgtriton; the only module that imports pb_utils.

It decodes request tensors with the shared wire contract, hands them to the backend's
:class:`GenerationService` (or the synthetic one) and turns the service's outputs into decoupled responses. Every
request ends with a FINAL response, also when it fails or is cancelled.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

import triton_python_backend_utils as pb_utils

from backend.entry import start_service
from backend.errors import BackendError, error_kind
from backend.telemetry import MetricsPublisher
from llgtriton import wire
from llgtriton.logs import configure_logging
from llgtriton.settings import engine_settings_from, env_name

logger = logging.getLogger("llgtriton.model")


def _triton_error(error: Exception) -> Any:
    """The error response's TritonError: its kind at the start of the message, and as Triton's code.

    (pb_utils.TritonError exists only once the stub runs.)
    """
    kind = error_kind(error)
    codes = pb_utils.TritonError
    by_kind = {
        wire.ErrorKind.INVALID_ARGUMENT: codes.INVALID_ARG,
        wire.ErrorKind.UNSUPPORTED: codes.UNSUPPORTED,
        wire.ErrorKind.UNAVAILABLE: codes.UNAVAILABLE,
    }
    return pb_utils.TritonError(wire.error_message(kind, str(error)), by_kind.get(kind, codes.INTERNAL))


class TritonResponseSink:
    """The backend's ResponseSink over one request's decoupled response sender."""

    def __init__(self, request: Any) -> None:
        self._sender = request.get_response_sender()

    def send(self, output: wire.GenerationOutput, *, final: bool) -> None:
        tensors = [pb_utils.Tensor(name, array) for name, array in wire.encode_output(output).items()]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self._sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)

    def fail(self, error: Exception) -> None:
        response = pb_utils.InferenceResponse(error=_triton_error(error))
        self._sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


class TritonMetricFactory:
    """The backend's MetricFactory over Triton's custom metrics API (served on Triton's metrics port)."""

    def __init__(self, model_name: str) -> None:
        self._labels = {"model": model_name}
        self._families: list[Any] = []
        self._metrics: list[Any] = []

    def counter(self, name: str, description: str) -> Any:
        return self._metric(name, description, pb_utils.MetricFamily.COUNTER)

    def gauge(self, name: str, description: str) -> Any:
        return self._metric(name, description, pb_utils.MetricFamily.GAUGE)

    def _metric(self, name: str, description: str, kind: Any) -> Any:
        family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
        self._families.append(family)
        self._metrics.append(family.Metric(labels=self._labels))
        return self._metrics[-1]

    def close(self) -> None:
        self._metrics.clear()  # Triton wants the metrics gone before their families
        self._families.clear()


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        configure_logging(os.environ.get(env_name(None, "log_level"), "info"))
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("the llm model must be decoupled (streaming responses)")
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        # The instances of this model in this server (the stubs are tritonserver's children) share
        # one engine process when the engine runs in one.
        shared_as = f"{os.getppid()}/{args['model_repository']}/{args['model_version']}"
        service = start_service(engine_settings_from(parameters, os.environ), shared_as=shared_as)
        self._service = service
        self._metric_factory = TritonMetricFactory(args["model_name"])
        self._metrics = MetricsPublisher(
            self._metric_factory, service.step_counters, service.load, active=lambda: service.reports_engine
        )
        self._metrics.start()
        self._counter = 0

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sink = TritonResponseSink(request)
            self._counter += 1
            request_id = request.request_id() or f"triton-{self._counter}"
            try:
                if _input(request, wire.HEALTH_CHECK) is not None:
                    self._service.health()
                    sink.send(wire.GenerationOutput(text="", finish_reason=wire.FinishReason.STOP), final=True)
                    continue
                generation = wire.decode_request(functools.partial(_input, request))
                self._service.submit(generation, request_id, sink)
            except (wire.WireError, BackendError) as exc:
                logger.info("request %s refused: %s", request_id, exc)
                sink.fail(exc)
            except Exception as exc:  # a bug: this request fails with a short message, the others go on
                logger.exception("request %s could not be taken", request_id)
                sink.fail(BackendError(f"the request could not be taken: {type(exc).__name__}"))

    def finalize(self) -> None:
        self._metrics.stop()
        self._metric_factory.close()
        self._service.shutdown()
