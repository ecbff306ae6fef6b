"""The readouts one served model is read with: a spec resolved to what its engine reads
(parallel becomes its sequential twin where the engine cannot run parallel layouts), and
the readout object of each resolved spec, built once by its family's `build` (`BUILDERS`,
by name: the one place a family is looked up)."""

from __future__ import annotations

from collections.abc import Callable

from openjev.core.readouts import letters, parallel, yesno
from openjev.core.readouts.per_type import PerTypeReadout
from openjev.core.readouts.spec import READOUT_NAMES, Readout, ReadoutContext, ReadoutSpec
from openjev.errors import Unsupported

BUILDERS: dict[str, Callable[[ReadoutSpec, ReadoutContext], Readout]] = {
    "letters": letters.build,
    "yesno": yesno.build,
    "parallel": parallel.build,
    "canonical": letters.build,
    "mirror": letters.build,
}

# What the parallel readout becomes on an engine that cannot run parallel layouts (every
# remote engine): its sequential twin, the same canonical order read once, which any engine
# runs and which is as order-free and as cheap.
PARALLEL_FALLBACK = ReadoutSpec("canonical")


class ReadoutCatalog:
    """The readouts of one model (`context`) on one engine (`parallel_layouts`: whether it
    runs parallel layouts, core/plan.py; where not, parallel is read as `parallel_fallback`)."""

    def __init__(
        self, context: ReadoutContext, *, parallel_layouts: bool, parallel_fallback: ReadoutSpec = PARALLEL_FALLBACK
    ) -> None:
        self.context = context
        self._parallel_layouts = parallel_layouts
        self._parallel_fallback = parallel_fallback
        self._built: dict[ReadoutSpec, Readout] = {}

    def resolve(self, spec: ReadoutSpec) -> ReadoutSpec:
        """The readout this engine reads for `spec` (in a per-type readout, part by part)."""
        if spec.per_type:
            plain = self.resolve(spec.plain)
            return ReadoutSpec(plain.name, plain.rotations, tuple((t, self.resolve(s)) for t, s in spec.per_type))
        if spec.name == "parallel" and not self._parallel_layouts:
            return self._parallel_fallback
        return spec

    def offered(self, rotations: int) -> dict[str, str]:
        """Per readout name this model can be read with: what is read for it (described)."""
        out = {}
        for name in READOUT_NAMES:
            spec = ReadoutSpec(name, rotations)
            try:
                self.readout(spec)
            except Unsupported:
                continue
            out[name] = self.resolve(spec).describe()
        return out

    def readout(self, spec: ReadoutSpec) -> Readout:
        """The readout object for `spec` (as resolved); Unsupported where this model cannot
        be read so."""
        spec = self.resolve(spec)
        found = self._built.get(spec)
        if found is None:
            if spec.per_type:
                found = PerTypeReadout(spec, self.readout(spec.plain), {t: self.readout(s) for t, s in spec.per_type})
            else:
                found = BUILDERS[spec.name](spec, self.context)
            self._built[spec] = found
        return found
