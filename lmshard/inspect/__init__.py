"""`lmshard inspect`: audit a prepared dataset against its metadata (`verify`) and describe it
(`audit`: samples, length histogram, top tokens, plot)."""

from .verify import Problem, Report, verify_dataset

__all__ = ["Problem", "Report", "verify_dataset"]
