"""The loader's reader of a dataset at a URL, a room of its own: `store.RemoteStore` (the remote
counterpart of runtime/store.py) over blockread (checked ranged reads of a split's blocks),
blockfetch and blockpool (the in-memory pool of decoded blocks and the exact prefetch), diskcache
(the optional bounded disk cache) and rowplan (where a step's rows lie in the blocks).

Nothing is imported here: a local dataset never loads this room, nor the object-store client
(lmshard.remote) it reads through."""
