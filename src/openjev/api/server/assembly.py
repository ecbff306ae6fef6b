"""The object graph behind the routes and its lifecycle: the engine loads in the background
at startup (off the event loop), the service is built over it, and both close at shutdown.
/health says 503 until `Runtime.ready()` holds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from openjev import calibrations
from openjev.api.contract.overrides import default_spec
from openjev.api.operations import disclosure
from openjev.config import MAX_CHOICE_OPTIONS, LimitSettings, QualitySettings, Settings
from openjev.core.abstain import AbstainRule
from openjev.core.calibration import Calibration
from openjev.core.ports import Admission
from openjev.core.prompts import PromptCompiler
from openjev.core.readouts import ReadoutSpec
from openjev.core.service import DecisionService
from openjev.core.service_limits import ServiceLimits
from openjev.core.wording import PROMPT_VERSION
from openjev.engines import LoadedEngine, ModelCard
from openjev.errors import EngineUnavailable, NotReady

log = logging.getLogger(__name__)

Loader = Callable[[Settings], LoadedEngine]


@dataclass
class Runtime:
    """What the routes need once the model has loaded."""

    settings: Settings
    service: DecisionService | None = None
    loaded: LoadedEngine | None = None
    error: BaseException | None = None

    def ready(self) -> tuple[DecisionService, ModelCard]:
        if self.service is not None and self.loaded is not None:
            return self.service, self.loaded.card
        if self.error is not None:
            raise EngineUnavailable(disclosure.load_failure(self.error), detail=disclosure.log_text(self.error))
        raise NotReady("the model is still loading")


def service_limits(quality: QualitySettings, limits: LimitSettings, context_tokens: int | None = None) -> ServiceLimits:
    """The core's limits, from the settings that define their defaults (the core has none of
    its own), and the served model's context (`ModelCard.context_length`) where it is known."""
    return ServiceLimits(
        max_branch_tokens=limits.max_branch_tokens,
        max_request_tokens=limits.max_request_tokens,
        max_in_flight=limits.max_in_flight,
        engine_timeout_s=limits.engine_timeout_s,
        retry_after_s=limits.retry_after_s,
        temperature=quality.temperature,
        rotation_max_options=quality.rotation_max_options,
        max_branches=limits.max_branches,
        max_prompt_tokens=limits.max_prompt_tokens,
        context_tokens=context_tokens,
    )


def build_service(
    quality: QualitySettings, limits: LimitSettings, loaded: LoadedEngine, admission: Admission | None = None
) -> DecisionService:
    """Blocking (label verification encodes a few hundred short texts). Raises ConfigError
    for a calibration made for another model, prompt or temperature, Unsupported for a
    default readout this model cannot do."""
    calibration = calibrations.select(
        quality.calibration,
        fingerprint=loaded.card.fingerprint,
        prompt_version=PROMPT_VERSION,
        base_temperature=quality.temperature,
    )
    spec = default_spec(quality)
    abstain = AbstainRule(*quality.abstain_floors())
    if calibration is not None:
        spec, abstain = model_defaults(quality, calibration, spec, abstain)
        log.info(
            "calibration %s (%s) applied to %s",
            calibration.id,
            calibration.source or "given file",
            ", ".join(f.spec.describe() for f in calibration.fits),
        )
        if not calibration.covers(spec):
            log.warning(
                "calibration %s has no fit for the default readout %s: its answers are uncalibrated",
                calibration.id,
                spec.describe(),
            )
    compiler = PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)
    return DecisionService(
        compiler,
        loaded.engine,
        service_limits(quality, limits, loaded.card.context_length),
        readout=spec,
        calibration=calibration,
        abstain=abstain,
        parallel_layouts=loaded.engine.parallel_layouts,
        admission=admission,
    )


def model_defaults(
    quality: QualitySettings, calibration: Calibration, spec: ReadoutSpec, abstain: AbstainRule
) -> tuple[ReadoutSpec, AbstainRule]:
    """The served model's measured defaults, from its calibration file, where the operator
    left the global ones: --readout/--rotations at their defaults take the file's readout, the
    three --abstain-* floors at their defaults take the file's floors unless
    --ignore-model-abstain. A flag set to anything else wins (a flag set to the global default
    itself cannot be told from none: hence --ignore-model-abstain)."""
    if calibration.default_readout is not None and quality.readout_left():
        spec = calibration.default_readout
        log.info(
            "default readout %s: the one measured for this model (calibration %s)", spec.describe(), calibration.id
        )
    if calibration.default_abstain is not None and quality.abstain_left() and not quality.ignore_model_abstain:
        abstain = calibration.default_abstain
        log.info(
            "abstain floors %s: the ones measured for this model (calibration %s)", abstain.describe(), calibration.id
        )
    return spec, abstain


def lifespan(
    runtime: Runtime,
    admission: Admission,
    loader: Loader,
    on_fatal: Callable[[BaseException], None] | None,
    on_loaded: Callable[[], None] | None = None,
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """The app's lifespan: load the engine in the background (a failure is kept for /health
    and passed to `on_fatal`), then `on_loaded` (in a worker thread) before the service takes
    decisions; close the engine at shutdown. The service calls the engine through
    `admission` (core.ports.Admission, a decorator on the engine port)."""
    settings = runtime.settings

    def fatal(exc: BaseException) -> None:
        runtime.error = exc
        runtime.service = None
        if on_fatal is not None:
            on_fatal(exc)

    async def load() -> None:
        try:
            loaded = await asyncio.to_thread(loader, settings)
            runtime.loaded = loaded
            service = await asyncio.to_thread(build_service, settings.quality, settings.limits, loaded, admission)
            if on_loaded is not None:
                await asyncio.to_thread(on_loaded)
            runtime.service = service
            if loaded.supervise is not None:
                loaded.supervise(fatal)
            log.info("serving %s", loaded.card.name)
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed: /health shows it, on_fatal exits
            log.error("model failed to load: %s", disclosure.log_text(exc))
            fatal(exc)

    @asynccontextmanager
    async def run(_app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(load())
        try:
            yield
        finally:
            task.cancel()
            if runtime.loaded is not None:
                await runtime.loaded.engine.close()

    return run
