"""Other memory libraries' APIs over tkg: :mod:`tkg.compat.mem0` (Mem0's ``Memory``), and the framework adapters
:mod:`tkg.compat.langchain` and :mod:`tkg.compat.llamaindex` (each needs its framework installed)."""
