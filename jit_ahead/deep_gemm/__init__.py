"""DeepGEMM: its JIT cache key, its disk cache, and rebuilding a kernel from what a GPU run's cache entry
recorded, with no GPU and no DeepGEMM extension (docs/families.md)."""
