"""A pool's scheduler section made concrete: ``policy: engine`` becomes the serving
engine's policy, and keys another policy reads are refused."""

from __future__ import annotations

from simulator.engine.config import SchedulerSpec
from simulator.errors import ConfigError
from simulator.hardware.engines import ServingEngineProfile

# Keys that only one policy reads (None = that policy's default).
_OWN_KEYS = {"capacity_scheduler_policy": "trtllm", "schedule_policy": "sglang",
             "init_new_token_ratio": "sglang"}


def resolve_scheduler(spec: SchedulerSpec, engine: ServingEngineProfile, file: str | None,
                      key: str) -> SchedulerSpec:
    policy = engine.scheduler.policy if spec.policy == "engine" else spec.policy
    for name, owner in _OWN_KEYS.items():
        if getattr(spec, name) is not None and policy != owner:
            raise ConfigError(f"{name} applies to the {owner} policy only; this pool's "
                              f"scheduler policy is {policy} (set policy: {owner}, or drop "
                              f"{name})", file=file, key=f"{key}.scheduler.{name}")
    return spec.model_copy(update={"policy": policy})
