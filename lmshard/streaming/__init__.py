"""Training straight from text: `lmshard.stream(...)` reads, cleans and tokenizes as it trains."""

from .batches import StreamBatches
from .tokenstream import TokenStream, stream

__all__ = ["StreamBatches", "TokenStream", "stream"]
