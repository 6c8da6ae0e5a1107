"""Locust load shapes over llm_workload.shape_tick, sized at run time by --shape-users,
--shape-seconds and --shape-spawn-rate (see locustfile.py)."""

from __future__ import annotations

import llm_workload
from locust import LoadTestShape


class _WorkloadShape(LoadTestShape):
    abstract = True
    shape = "steady"

    def tick(self):
        options = self.runner.environment.parsed_options
        return llm_workload.shape_tick(
            self.shape, self.get_run_time(), options.shape_users, options.shape_seconds, options.shape_spawn_rate
        )


class SteadyShape(_WorkloadShape):
    shape = "steady"


class RampShape(_WorkloadShape):
    shape = "ramp"


class BurstShape(_WorkloadShape):
    shape = "burst"


SHAPES = {shape.shape: shape for shape in (SteadyShape, RampShape, BurstShape)}
