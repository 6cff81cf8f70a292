from .cache_manager import CacheManager, KVStats, NaiveCacheManager, PrefixMatch
from .kv_pool import KVPool
from .page_allocator import PageAllocator
from .page_table import PageTable
from .radix_cache import RadixCacheManager

__all__ = [
    "CacheManager",
    "KVPool",
    "KVStats",
    "NaiveCacheManager",
    "PageAllocator",
    "PageTable",
    "PrefixMatch",
    "RadixCacheManager",
]
