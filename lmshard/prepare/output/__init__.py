"""The output's durability: the one decision table for `--out` (`claim`), the build beside it
and its atomic swap with the writer lock (`staging`), a build's totals, progress and stop
signals (`build`) and the shard writer of import and retokenize (`writer`), the shards and key files written by
their owners in a planned run (`owners`), and the metadata (`metadata`).

Nothing here reads an input: documents arrive as tokens, lengths and keys.
"""
