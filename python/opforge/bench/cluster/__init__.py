"""Benchmark runs on a Ray cluster: ``opforge run --ray [ADDRESS]``.

The single-host runner's machinery (pairs.py, device.py, the worker protocol) runs on every GPU
of the cluster in a device worker (actor.py, a Ray actor); the driver (driver.py) plans, hands
out the work per GPU model (schedule.py, which also retries what a dying node had in flight),
streams the Traces back and alone writes the dataset. Ray is an optional extra
(``pip install 'opforge[ray]'``); this package imports without it and says how to install it
when a run needs it.
"""

from .driver import RAY_MISSING, ClusterLog, RayBenchmark, RayConfig, require_ray

__all__ = ["ClusterLog", "RAY_MISSING", "RayBenchmark", "RayConfig", "require_ray"]
