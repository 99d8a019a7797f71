"""Training straight from text: `lmshard.stream(...)` reads, cleans and tokenizes as it trains."""

from .tokenstream import StreamBatches, TokenStream, stream

__all__ = ["StreamBatches", "TokenStream", "stream"]
