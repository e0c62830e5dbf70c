"""Pure cost functions: roofline, collectives, memory and the step time of a batch."""

from simulator.cost.batch import BatchShape
from simulator.cost.collectives import allgather_time, allreduce_time, alltoall_time, p2p_time
from simulator.cost.memory import MemoryPlan, plan_memory, stage_weight_bytes
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.roofline import OpTime, op_time, roofline
from simulator.cost.step import InstanceCostModel, LinkSet, StepCost

__all__ = [
    "BatchShape",
    "InstanceCostModel",
    "LinkSet",
    "MemoryPlan",
    "OpTime",
    "Parallelism",
    "Precisions",
    "StepCost",
    "allgather_time",
    "allreduce_time",
    "alltoall_time",
    "op_time",
    "p2p_time",
    "plan_memory",
    "roofline",
    "stage_weight_bytes",
]
