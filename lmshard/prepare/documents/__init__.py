"""The per-document pipeline: what an input is and how it is read (`files`, `reading`, `walk`,
`decompress`; for objects at URLs `urlwalk`, `urlfile`), inputs as an ordered stream of work
items (`sources`), bytes as records (`records`; `streamed` for CSV and JSON arrays, `columnar`,
`hf`), cleaning and filters (`clean`), the
dedup key set and the seeded split (`dedup`), and a worker's whole path for one item: parse →
clean → key → tokenize (`worker`).

Nothing here knows how a run is scheduled or where its output goes: a work item goes in, an
`ItemResult` comes out, in whichever process runs it.
"""
