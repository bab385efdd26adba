"""Storage backends for tkg, installed as ``tkg.backends``.

* :class:`tkg.backends.memory.InMemoryStore` -- in-process: igraph + hnswlib + bm25s, snapshots to msgpack.
"""
