"""The scheduler: dependency-aware reordering of `.schedule` regions and a model of the control
codes (stall, yield, scoreboards) the chosen order needs on sm_70+ (tuned for sm_90).

  classify.py        PTX instruction -> timing class, memory effects, placement
  latencies_sm90.py  the latency/issue table, every figure with its source
  depgraph.py        the dependency graph of one region
  list_scheduler.py  list scheduling with critical-path priority; the issue model
  control_codes.py   the control codes an order needs under the model
  schedule.py        schedule_module: the pipeline stage (asm/pipeline.py calls it)
  compare_sass.py    the model's control codes next to the ones ptxas chose
"""
from .compare_sass import SassComparison, compare_with_sass
from .schedule import RegionReport, ScheduleReport, schedule_module, schedule_region

__all__ = ["schedule_module", "schedule_region", "ScheduleReport", "RegionReport",
           "compare_with_sass", "SassComparison"]
