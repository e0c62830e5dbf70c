"""disagg-sim: a discrete-event simulator of LLM inference clusters."""

__version__ = "0.1.0"
