/* tencache pinned-buffer arena: public C API.
 *
 * Glossary
 *   size class  A slot size (slot_bytes, a multiple of TC_SLOT_ALIGN_BYTES) and how many slots of that size
 *               exist (slot_count). Classes are fixed at creation, sorted ascending, no two of the same size.
 *   region      One mmap per size class, of slot_count * slot_bytes bytes; page-locked with mlock unless the
 *               lock mode says otherwise. Region i belongs to class i. Regions never grow or move, so a
 *               caller can register them with CUDA (cudaHostRegister) once, after creation. Not inherited
 *               by fork()ed children (MADV_DONTFORK).
 *   slot        One slot_bytes piece of a region, handed out whole by tc_arena_alloc. Its address, its size,
 *               and so any file offset that is a multiple of it, are 4 KiB aligned: safe for O_DIRECT.
 *
 *   region of class c:  | slot 0 | slot 1 | ... | slot slot_count-1 |     each slot: slot_bytes
 *
 * Errors are returned as TC_* codes (tc_strerror names them); nothing in this library aborts or prints.
 * Thread safety: alloc, free, retire, restore, stats, class_stats and validate may be called from any thread
 * at once.
 * create and destroy must not race with any other call on the same arena.
 *
 * Build (plain C11, no libtorch, no CUDA): see setup.py; the C tests: csrc/tests/test_arena.c.
 */
#ifndef TENCACHE_ARENA_H
#define TENCACHE_ARENA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported even where the build hides symbols by default: Python reaches these through ctypes. */
#if defined(__GNUC__)
#define TC_API __attribute__((visibility("default")))
#else
#define TC_API
#endif

#define TC_SLOT_ALIGN_BYTES 4096u /* 4 KiB; = O_DIRECT alignment; slot_bytes is rounded up to it */
#define TC_MAX_CLASSES 64u        /* free() finds the class by a linear scan over the classes */
#define TC_ARENA_ABI_VERSION 2u   /* bump when a struct below or a signature changes (ctypes mirrors them) */

typedef struct tc_arena_s tc_arena_t;

typedef struct {
    uint64_t slot_bytes; /* requested slot size; rounded up to TC_SLOT_ALIGN_BYTES */
    uint64_t slot_count; /* number of slots; classes of the same rounded size are merged (counts added) */
} tc_class_spec_t;

typedef struct {
    uint64_t reserved;         /* SUM (bytes): all regions */
    uint64_t locked;           /* SUM (bytes): page-locked now (locked regions less their retired slots) */
    uint64_t in_use;           /* SUM (bytes): slot bytes of the slots handed out */
    uint64_t peak_in_use;      /* PEAK (bytes): of in_use */
    uint64_t requested_in_use; /* SUM (bytes): requested nbytes of the slots handed out; in_use - this = waste */
    uint64_t allocs;           /* COUNT: successful allocs */
    uint64_t frees;            /* COUNT: successful frees */
    uint64_t failed_allocs;    /* COUNT: allocs that returned TC_EEMPTY */
    uint64_t lock_fallbacks;   /* COUNT: regions left unlocked under TC_LOCK_BEST_EFFORT */
    uint64_t n_regions;        /* COUNT: regions (= n_classes) */
    uint64_t n_classes;        /* COUNT: size classes after rounding and merging */
    uint64_t retired;          /* SUM (bytes): slots whose pages were given back (tc_arena_retire) */
} tc_stats_t;

typedef struct {
    uint64_t slot_bytes;        /* rounded slot size */
    uint64_t slot_count;        /* slots in this class */
    uint64_t slots_in_use;      /* COUNT: slots handed out now */
    uint64_t peak_slots_in_use; /* PEAK: of slots_in_use */
    uint64_t locked;            /* 1 if this class's region is page-locked, else 0 */
    uint64_t slots_retired;     /* COUNT: slots retired (neither free nor in use), or being retired or restored */
} tc_class_stats_t;

enum {
    TC_OK = 0,
    TC_EINVAL = 1,   /* bad argument, or tc_arena_validate found a broken invariant */
    TC_ENOMEM = 2,   /* mmap (or the bookkeeping allocation) failed */
    TC_ELOCK = 3,    /* mlock failed and the lock mode is TC_LOCK_REQUIRED */
    TC_EEMPTY = 4,   /* no class that fits has a free slot */
    TC_ENOTOWNED = 5, /* free of a pointer the arena did not hand out, or a double free */
    TC_ERELEASE = 6   /* munlock or madvise refused to give a slot's pages back (tc_arena_retire) */
};

enum {
    TC_LOCK_OFF = 0,         /* never mlock */
    TC_LOCK_BEST_EFFORT = 1, /* mlock; a region that cannot be locked stays unlocked (counted in lock_fallbacks) */
    TC_LOCK_REQUIRED = 2     /* mlock; any failure unmaps everything and returns TC_ELOCK */
};

/* Map (and lock) one region per class. On success *out owns everything; on failure nothing is left mapped. */
TC_API int tc_arena_create(const tc_class_spec_t* classes, uint32_t n_classes, int lock_mode, tc_arena_t** out);

/* Hand out a slot of the smallest class whose slot_bytes >= nbytes and that has a free slot; *out_class is
 * that class's index. The memory is NOT zeroed. TC_EEMPTY if no such class (also when nbytes exceeds the
 * largest class); TC_EINVAL for nbytes == 0. O(n_classes). */
TC_API int tc_arena_alloc(tc_arena_t* arena, uint64_t nbytes, void** out_ptr, uint32_t* out_class);

/* Give a slot back. TC_ENOTOWNED for a pointer that is not the start of a handed-out slot. O(n_classes). */
TC_API int tc_arena_free(tc_arena_t* arena, void* ptr);

/* Give up to max_slots free slots of class cls back to the kernel: they leave the free list and their pages are
 * unlocked and dropped (munlock, madvise MADV_DONTNEED); the address range stays reserved. *out_n: how many.
 * TC_ERELEASE when the kernel refuses (the slot stays free and locked; *out_n counts those retired before).
 * Never on a region registered with CUDA: the driver holds its own references to the pages, so dropping them
 * would not free memory and would leave device copies reading other pages than the host writes. */
TC_API int tc_arena_retire(tc_arena_t* arena, uint32_t cls, uint64_t max_slots, uint64_t* out_n);

/* Put up to max_slots retired slots of class cls back on its free list, page-locked again if the class is
 * (mlock; the pages are zero-filled on first touch). TC_ELOCK when a slot cannot be locked: it stays retired,
 * and *out_n counts those restored before it. */
TC_API int tc_arena_restore(tc_arena_t* arena, uint32_t cls, uint64_t max_slots, uint64_t* out_n);

TC_API int tc_arena_stats(const tc_arena_t* arena, tc_stats_t* out);
TC_API int tc_arena_class_stats(const tc_arena_t* arena, uint32_t cls, tc_class_stats_t* out);

/* Base and size of region i (i < n_regions), e.g. for cudaHostRegister. Constant for the arena's lifetime. */
TC_API int tc_arena_region(const tc_arena_t* arena, uint32_t i, void** base, uint64_t* bytes);

/* Walk every invariant (free lists, per-slot flags, counters). TC_OK, or TC_EINVAL on the first violation.
 * O(total slots); for tests and debug builds. */
TC_API int tc_arena_validate(const tc_arena_t* arena);

/* Unmap every region (which also unlocks it) and free the arena. NULL is a no-op. Slots still handed out
 * become invalid. */
TC_API void tc_arena_destroy(tc_arena_t* arena);

/* Static description of a TC_* code; never NULL. */
TC_API const char* tc_strerror(int code);

/* TC_ARENA_ABI_VERSION of the compiled library, so a binding can refuse a stale build. */
TC_API uint32_t tc_arena_abi_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TENCACHE_ARENA_H */
