"""What a store counts over its life. Owns: the counter fields and what each counts; the store's parts add to them
(cache/entry_store.py, transfers.py, admission.py, write_back.py) under the store's lock."""
import dataclasses


@dataclasses.dataclass
class StoreCounters:
    """COUNT since start, protected by the store's lock."""

    hits: int = 0            # a lend served from a held buffer: no I/O, no copy
    stored_in_held: int = 0  # parts stored into a held buffer (write_parts: gradient fragments), not a lend: apart
    #                          from hits, which the host hit rate divides (they read high with reduce buckets)
    misses: int = 0          # a lend that read the file
    copied: int = 0          # a lend of an entry on file served by copying another copy of its bytes (no read)
    copied_bytes: int = 0    # ... and the bytes those copies took instead of a read
    evictions: int = 0       # held buffers given up for another entry
    written_back: int = 0    # writes of changed bytes (evictions, flushes, entries that could not be kept)
    bypassed: int = 0        # entries not admitted (served transiently) because every victim was needed sooner
    waits_for_slots: int = 0  # acquisitions that waited for one write to free a buffer
    transient_buffers: int = 0  # entries served from a transient buffer (not kept after use)
    write_errors: int = 0    # writes that failed (the entry kept its bytes, DIRTY)
    io_wait_s: float = 0.0   # time callers were blocked on this store's reads and writes
    prefetch_issued: int = 0  # reads started ahead of their use (start_read(prefetch=True) of a miss)
    prefetch_late: int = 0   # ... not finished when wait_read came
    prefetch_evictions: int = 0  # held unchanged buffers a read ahead took at once (each needed after its target)
    prefetch_write_backs: int = 0  # evictions of changed ones started for a read ahead (its buffer once written)
    prefix_read_bytes_saved: int = 0   # bytes a read took from an entry's prefix instead of its file
    prefix_write_bytes_saved: int = 0  # bytes an eviction's write left in an entry's prefix instead of its file
