"""The core's ServiceLimits as a server would build them: the settings' defaults, with `flat`
settings changed (the core has no defaults of its own)."""

from openjev.api.server.assembly import service_limits
from openjev.config import load_settings
from openjev.core.service_limits import ServiceLimits


def limits_of(**flat) -> ServiceLimits:
    settings = load_settings(flat, environ={})
    return service_limits(settings.quality, settings.limits)
