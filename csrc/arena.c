/* Pinned-buffer arena: one page-locked region per size class, O(1) free lists of slot indices.
 * Owns: mapping, locking, handing out and taking back slots, the counters. Does not own: CUDA registration
 * (tencache_ds/memory/pinning.py) or choosing the classes (tencache_ds/plan).
 *
 * Note [Pinned arena design]
 * Rationale: ZeRO-3 offload moves tensors whose sizes come from a handful of partition shapes, over and over.
 *   A fixed set of size classes, each a region mapped and locked once, makes alloc/free O(1) with no
 *   fragmentation, and keeps mmap/mlock/cudaHostRegister (milliseconds each on large buffers) off the hot path.
 * Approach: the classes are sorted by slot_bytes. Each class keeps a stack of free slot indices (LIFO: the
 *   slot freed last, still warm in cache and TLB, goes out first) and one in-use byte per slot, so a double
 *   or foreign free is an error code and not a corrupted free list. requested[] keeps the nbytes each live
 *   slot was asked for, so the waste of the size classes is a counter, not a guess.
 *   Slots are NOT zeroed on alloc: every caller overwrites the slot (NVMe read or tensor copy) before it
 *   reads it, and zeroing GB-sized slots would cost as much as the copy itself.
 * Lock discipline: one mutex guards the mutable state (free stacks, in-use bytes, counters). mmap, mlock and
 *   munmap run only in create/destroy, which are never concurrent with other calls on the arena, so no
 *   syscall that can take milliseconds runs under the mutex. cudaHostRegister is done from Python over whole
 *   regions, after create and outside the mutex.
 * Giving memory back: tc_arena_retire takes free slots off their free list and returns their pages to the
 *   kernel (munlock, then madvise MADV_DONTNEED), keeping the address range; tc_arena_restore locks them
 *   again and puts them back. A host under memory pressure gets the memory of a shrunk cache while the
 *   regions (and any CUDA registration of other classes) stay where they are. The syscalls run outside the
 *   mutex: a slot is marked retired (or restoring) first, so no alloc can hand it out meanwhile.
 * Limitations: no growth beyond the created slots and no splitting. A request larger than every class fails
 *   (TC_EEMPTY); a request whose class is full takes a slot of a larger class (more waste, visible in
 *   requested_in_use). Regions are MADV_DONTFORK: a fork()ed child does not have them (touching a slot there
 *   faults).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS and madvise are not in strict C11 + POSIX */

#include "tencache/arena.h"

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* in_use[] per slot. */
enum {
    SLOT_FREE = 0,
    SLOT_HANDED_OUT = 1,
    SLOT_LISTED = 2,    /* validate's mark for a free-stack entry */
    SLOT_RETIRING = 3,  /* taken off the free stack; its pages are being given back outside the mutex */
    SLOT_RETIRED = 4,   /* its pages are given back */
    SLOT_RESTORING = 5  /* retired, being locked again outside the mutex */
};

#ifdef TC_DEBUG
#include <stdio.h>
#endif

typedef struct {
    /* Fixed after tc_arena_create. */
    uint8_t* base;         /* region start; page aligned (mmap) */
    uint64_t slot_bytes;   /* multiple of TC_SLOT_ALIGN_BYTES */
    uint64_t slot_count;   /* <= UINT32_MAX (free_stack holds uint32 indices) */
    uint64_t region_bytes; /* slot_bytes * slot_count */
    int locked;            /* region is mlock'ed */
    /* LOCK: the rest is protected by tc_arena_s.mutex. */
    uint32_t* free_stack;       /* free slot indices; free_stack[n_free - 1] goes out next */
    uint64_t n_free;            /* COUNT: entries on free_stack */
    uint8_t* in_use;            /* per slot: SLOT_HANDED_OUT while handed out, SLOT_RETIRED / SLOT_RESTORING
                                 * while its pages are given back, else SLOT_FREE */
    uint64_t* requested;        /* per slot: nbytes asked for while handed out, else 0 */
    uint64_t peak_slots_in_use; /* PEAK: of slot_count - n_free - n_retired */
    uint64_t n_retired;         /* COUNT: slots neither free nor handed out (SLOT_RETIRING, _RETIRED, _RESTORING) */
} tc_class_t;

struct tc_arena_s {
    pthread_mutex_t mutex;
    uint32_t n_classes;
    tc_class_t classes[TC_MAX_CLASSES]; /* ascending, distinct slot_bytes */
    /* reserved, lock_fallbacks, n_regions, n_classes are fixed after create;
     * LOCK: the other fields (locked and retired change with retire/restore) are protected by mutex. */
    tc_stats_t stats;
};

/* The mutex lives inside the (non-const) arena object, so locking it from a const-qualified query is fine. */
static void arena_lock(const tc_arena_t* arena) {
    int rc = pthread_mutex_lock((pthread_mutex_t*)&arena->mutex);
    assert(rc == 0);
    (void)rc;
}

static void arena_unlock(const tc_arena_t* arena) {
    int rc = pthread_mutex_unlock((pthread_mutex_t*)&arena->mutex);
    assert(rc == 0);
    (void)rc;
}

/* Round each class up to 4 KiB, merge equal sizes, sort ascending.
 * e.g. {5000 x 2, 8192 x 1, 100 x 3} -> {4096 x 3, 8192 x 3}. */
static int normalize_classes(const tc_class_spec_t* in, uint32_t n_in, tc_class_spec_t* out, uint32_t* n_out) {
    const uint64_t align = TC_SLOT_ALIGN_BYTES;
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_in; i++) {
        if (in[i].slot_bytes == 0 || in[i].slot_count == 0 || in[i].slot_bytes > UINT64_MAX - (align - 1)) {
            return TC_EINVAL;
        }
        const uint64_t bytes = (in[i].slot_bytes + align - 1) / align * align;
        uint32_t pos = 0;
        while (pos < n && out[pos].slot_bytes < bytes) pos++;
        if (pos < n && out[pos].slot_bytes == bytes) {
            if (out[pos].slot_count > UINT64_MAX - in[i].slot_count) return TC_EINVAL;
            out[pos].slot_count += in[i].slot_count;
            continue;
        }
        for (uint32_t k = n; k > pos; k--) out[k] = out[k - 1]; /* n < n_in <= TC_MAX_CLASSES */
        out[pos].slot_bytes = bytes;
        out[pos].slot_count = in[i].slot_count;
        n++;
    }
    for (uint32_t i = 0; i < n; i++) {
        /* uint32 slot indices; the region size must fit in size_t for mmap. */
        if (out[i].slot_count > UINT32_MAX || out[i].slot_count > SIZE_MAX / out[i].slot_bytes) return TC_EINVAL;
    }
    *n_out = n;
    return TC_OK;
}

/* Map one region and its bookkeeping. On failure leaves whatever it got for class_release. */
static int class_init(tc_class_t* c, const tc_class_spec_t* spec) {
    c->slot_bytes = spec->slot_bytes;
    c->slot_count = spec->slot_count;
    c->region_bytes = spec->slot_bytes * spec->slot_count;
    /* MAP_NORESERVE: a region is committed page by page as slots come into use (a retired slot holds no memory),
     * so the whole reservation need not pass the kernel's overcommit heuristic up front: the optimizer's streaming
     * slots of a 1e9-element sub-group (DeepSpeed's default) are 32 GB of addresses that a machine with less
     * RAM refused at start-up, most of them never touched. Strict overcommit (mode 2) ignores the flag. */
    void* p = mmap(NULL, (size_t)c->region_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return TC_ENOMEM;
    c->base = p;
#ifdef MADV_HUGEPAGE
    /* Fewer TLB misses on multi-MiB copies; THP may be off ("never"), which only costs speed. */
    (void)madvise(p, (size_t)c->region_bytes, MADV_HUGEPAGE);
#endif
#ifdef MADV_DONTFORK
    /* Keep the region out of fork()ed children (DataLoader workers): otherwise the kernel must copy pages
     * that CUDA has pinned at fork time, or copy-on-write them later, for memory the child never uses. */
    (void)madvise(p, (size_t)c->region_bytes, MADV_DONTFORK);
#endif
    c->free_stack = malloc((size_t)c->slot_count * sizeof(uint32_t));
    c->in_use = calloc((size_t)c->slot_count, sizeof(uint8_t));
    c->requested = calloc((size_t)c->slot_count, sizeof(uint64_t));
    if (c->free_stack == NULL || c->in_use == NULL || c->requested == NULL) return TC_ENOMEM;
    /* Slot 0 on top, so a fresh arena hands out addresses in ascending order. */
    for (uint64_t k = 0; k < c->slot_count; k++) c->free_stack[k] = (uint32_t)(c->slot_count - 1 - k);
    c->n_free = c->slot_count;
    return TC_OK;
}

static void class_release(tc_class_t* c) {
    if (c->base != NULL) {
        int rc = munmap(c->base, (size_t)c->region_bytes); /* also undoes mlock */
        assert(rc == 0);
        (void)rc;
    }
    free(c->free_stack);
    free(c->in_use);
    free(c->requested);
}

int tc_arena_create(const tc_class_spec_t* classes, uint32_t n_classes, int lock_mode, tc_arena_t** out) {
    if (out == NULL) return TC_EINVAL;
    *out = NULL;
    if (classes == NULL || n_classes == 0 || n_classes > TC_MAX_CLASSES) return TC_EINVAL;
    if (lock_mode != TC_LOCK_OFF && lock_mode != TC_LOCK_BEST_EFFORT && lock_mode != TC_LOCK_REQUIRED) {
        return TC_EINVAL;
    }
    tc_class_spec_t specs[TC_MAX_CLASSES];
    uint32_t n = 0;
    int rc = normalize_classes(classes, n_classes, specs, &n);
    if (rc != TC_OK) return rc;

    tc_arena_t* arena = calloc(1, sizeof(*arena));
    if (arena == NULL) return TC_ENOMEM;
    if (pthread_mutex_init(&arena->mutex, NULL) != 0) {
        free(arena);
        return TC_ENOMEM;
    }
    arena->stats.n_classes = n;
    arena->stats.n_regions = n;
    for (uint32_t i = 0; i < n; i++) {
        arena->n_classes = i + 1; /* so that destroy releases a half-built class too */
        rc = class_init(&arena->classes[i], &specs[i]);
        if (rc != TC_OK) {
            tc_arena_destroy(arena);
            return rc;
        }
        arena->stats.reserved += arena->classes[i].region_bytes;
    }
    /* mlock faults every page in, so locking is also what makes the reservation real. */
    for (uint32_t i = 0; i < n && lock_mode != TC_LOCK_OFF; i++) {
        tc_class_t* c = &arena->classes[i];
        if (mlock(c->base, (size_t)c->region_bytes) == 0) {
            c->locked = 1;
            arena->stats.locked += c->region_bytes;
        } else if (lock_mode == TC_LOCK_REQUIRED) {
            tc_arena_destroy(arena);
            return TC_ELOCK;
        } else {
            /* mlock may have locked and faulted in part of the region before it failed (a memory limit): undo,
               or those pages stay pinned, count against the limit, and retiring them fails for good */
            (void)munlock(c->base, (size_t)c->region_bytes);
            (void)madvise(c->base, (size_t)c->region_bytes, MADV_DONTNEED);
            arena->stats.lock_fallbacks++; /* keep going: a later, smaller region may still fit the limit */
        }
    }
    *out = arena;
    return TC_OK;
}

int tc_arena_alloc(tc_arena_t* arena, uint64_t nbytes, void** out_ptr, uint32_t* out_class) {
    if (out_ptr != NULL) *out_ptr = NULL;
    if (arena == NULL || out_ptr == NULL || nbytes == 0) return TC_EINVAL;
    arena_lock(arena);
    for (uint32_t i = 0; i < arena->n_classes; i++) {
        tc_class_t* c = &arena->classes[i];
        if (c->slot_bytes < nbytes || c->n_free == 0) continue;
        const uint32_t idx = c->free_stack[--c->n_free];
        assert(idx < c->slot_count && c->in_use[idx] == SLOT_FREE);
        c->in_use[idx] = SLOT_HANDED_OUT;
        c->requested[idx] = nbytes;
        const uint64_t slots_in_use = c->slot_count - c->n_free - c->n_retired;
        if (slots_in_use > c->peak_slots_in_use) c->peak_slots_in_use = slots_in_use;
        tc_stats_t* s = &arena->stats;
        s->in_use += c->slot_bytes;
        if (s->in_use > s->peak_in_use) s->peak_in_use = s->in_use;
        s->requested_in_use += nbytes;
        s->allocs++;
        arena_unlock(arena);
        *out_ptr = c->base + (uint64_t)idx * c->slot_bytes;
        if (out_class != NULL) *out_class = i;
        return TC_OK;
    }
    arena->stats.failed_allocs++;
    arena_unlock(arena);
    return TC_EEMPTY;
}

int tc_arena_free(tc_arena_t* arena, void* ptr) {
    if (arena == NULL) return TC_EINVAL;
    const uintptr_t p = (uintptr_t)ptr;
    /* base, region_bytes and slot_bytes never change after create: no lock needed to find the slot. */
    for (uint32_t i = 0; i < arena->n_classes; i++) {
        tc_class_t* c = &arena->classes[i];
        const uintptr_t base = (uintptr_t)c->base;
        if (p < base || p - base >= c->region_bytes) continue;
        if ((p - base) % c->slot_bytes != 0) return TC_ENOTOWNED; /* inside a slot, not its start */
        const uint64_t idx = (p - base) / c->slot_bytes;
        arena_lock(arena);
        if (c->in_use[idx] != SLOT_HANDED_OUT) { /* double free, or a retired slot */
            arena_unlock(arena);
            return TC_ENOTOWNED;
        }
        assert(c->n_free < c->slot_count);
        c->in_use[idx] = SLOT_FREE;
        arena->stats.in_use -= c->slot_bytes;
        arena->stats.requested_in_use -= c->requested[idx];
        arena->stats.frees++;
        c->requested[idx] = 0;
        c->free_stack[c->n_free++] = (uint32_t)idx;
        arena_unlock(arena);
        return TC_OK;
    }
    return TC_ENOTOWNED; /* NULL, or an address in no region */
}

int tc_arena_retire(tc_arena_t* arena, uint32_t cls, uint64_t max_slots, uint64_t* out_n) {
    if (out_n != NULL) *out_n = 0;
    if (arena == NULL || out_n == NULL || cls >= arena->n_classes) return TC_EINVAL;
    tc_class_t* c = &arena->classes[cls];
    for (uint64_t k = 0; k < max_slots; k++) {
        arena_lock(arena);
        if (c->n_free == 0) {
            arena_unlock(arena);
            break;
        }
        /* The bottom of the LIFO stack: the slot unused for longest, the coldest in cache and TLB. */
        const uint32_t idx = c->free_stack[0];
        c->n_free--;
        memmove(c->free_stack, c->free_stack + 1, (size_t)c->n_free * sizeof(uint32_t));
        c->in_use[idx] = SLOT_RETIRING; /* neither handed out nor restored while its pages go */
        c->n_retired++;
        arena_unlock(arena);
        uint8_t* slot = c->base + (uint64_t)idx * c->slot_bytes;
        /* A locked range cannot be dropped (madvise: EINVAL): unlock it first. munlock splits the mapping, which
         * fails (ENOMEM) at vm.max_map_count; the slot then stays in use, locked, and the caller hears of it. */
        const int unlocked = !c->locked || munlock(slot, (size_t)c->slot_bytes) == 0;
        const int dropped = unlocked && madvise(slot, (size_t)c->slot_bytes, MADV_DONTNEED) == 0;
        if (unlocked && !dropped && c->locked) (void)mlock(slot, (size_t)c->slot_bytes); /* as it was */
        arena_lock(arena);
        if (!dropped) {
            c->in_use[idx] = SLOT_FREE;
            c->free_stack[c->n_free++] = idx;
            c->n_retired--;
            arena_unlock(arena);
            return TC_ERELEASE;
        }
        c->in_use[idx] = SLOT_RETIRED;
        arena->stats.retired += c->slot_bytes;
        if (c->locked) arena->stats.locked -= c->slot_bytes;
        arena_unlock(arena);
        (*out_n)++;
    }
    return TC_OK;
}

int tc_arena_restore(tc_arena_t* arena, uint32_t cls, uint64_t max_slots, uint64_t* out_n) {
    if (out_n != NULL) *out_n = 0;
    if (arena == NULL || out_n == NULL || cls >= arena->n_classes) return TC_EINVAL;
    tc_class_t* c = &arena->classes[cls];
    uint64_t scan = 0; /* retired slots are found by a scan: restoring is rare (memory came back) */
    for (uint64_t k = 0; k < max_slots; k++) {
        arena_lock(arena);
        while (scan < c->slot_count && c->in_use[scan] != SLOT_RETIRED) scan++;
        if (scan == c->slot_count) {
            arena_unlock(arena);
            break;
        }
        const uint64_t idx = scan;
        c->in_use[idx] = SLOT_RESTORING;
        arena_unlock(arena);
        uint8_t* slot = c->base + idx * c->slot_bytes;
        const int relocked = !c->locked || mlock(slot, (size_t)c->slot_bytes) == 0;
        if (!relocked) { /* mlock may have locked and faulted in part of the range before it failed: undo */
            (void)munlock(slot, (size_t)c->slot_bytes);
            (void)madvise(slot, (size_t)c->slot_bytes, MADV_DONTNEED);
        }
        arena_lock(arena);
        if (!relocked) {
            c->in_use[idx] = SLOT_RETIRED;
            arena_unlock(arena);
            return TC_ELOCK;
        }
        c->in_use[idx] = SLOT_FREE;
        c->free_stack[c->n_free++] = (uint32_t)idx;
        c->n_retired--;
        arena->stats.retired -= c->slot_bytes;
        if (c->locked) arena->stats.locked += c->slot_bytes;
        arena_unlock(arena);
        (*out_n)++;
    }
    return TC_OK;
}

int tc_arena_stats(const tc_arena_t* arena, tc_stats_t* out) {
    if (arena == NULL || out == NULL) return TC_EINVAL;
    arena_lock(arena);
    *out = arena->stats;
    arena_unlock(arena);
    return TC_OK;
}

int tc_arena_class_stats(const tc_arena_t* arena, uint32_t cls, tc_class_stats_t* out) {
    if (arena == NULL || out == NULL || cls >= arena->n_classes) return TC_EINVAL;
    const tc_class_t* c = &arena->classes[cls];
    arena_lock(arena);
    out->slot_bytes = c->slot_bytes;
    out->slot_count = c->slot_count;
    out->slots_in_use = c->slot_count - c->n_free - c->n_retired;
    out->peak_slots_in_use = c->peak_slots_in_use;
    out->locked = (uint64_t)c->locked;
    out->slots_retired = c->n_retired;
    arena_unlock(arena);
    return TC_OK;
}

int tc_arena_region(const tc_arena_t* arena, uint32_t i, void** base, uint64_t* bytes) {
    if (arena == NULL || base == NULL || bytes == NULL || i >= arena->n_classes) return TC_EINVAL;
    *base = arena->classes[i].base;
    *bytes = arena->classes[i].region_bytes;
    return TC_OK;
}

/* Build with -DTC_DEBUG to have validate name the first check that failed. */
#ifdef TC_DEBUG
#define TC_VCHECK(cond)                                                                   \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            if (ok) fprintf(stderr, "tc_arena_validate: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            ok = 0;                                                                       \
        }                                                                                 \
    } while (0)
#else
#define TC_VCHECK(cond) \
    do {                \
        if (!(cond)) ok = 0; \
    } while (0)
#endif

/* Check one class under the arena mutex; add its live slots to the running sums. Free-stack entries are
 * marked SLOT_LISTED in in_use for the duplicate check and reset to SLOT_FREE by the second loop, whatever the
 * outcome. */
static int validate_class(const tc_class_t* c, uint64_t* live_slots, uint64_t* live_bytes, uint64_t* requested,
                          uint64_t* retired_bytes) {
    int ok = 1;
    TC_VCHECK(c->base != NULL && (uintptr_t)c->base % TC_SLOT_ALIGN_BYTES == 0);
    TC_VCHECK(c->slot_bytes > 0 && c->slot_bytes % TC_SLOT_ALIGN_BYTES == 0);
    TC_VCHECK(c->region_bytes == c->slot_bytes * c->slot_count);
    TC_VCHECK(c->n_free + c->n_retired <= c->slot_count);
    if (!ok) return 0;
    for (uint64_t k = 0; k < c->n_free; k++) {
        const uint32_t idx = c->free_stack[k];
        TC_VCHECK(idx < c->slot_count && c->in_use[idx] == SLOT_FREE); /* SLOT_LISTED: a slot listed twice */
        if (!ok) break;
        c->in_use[idx] = SLOT_LISTED;
    }
    uint64_t live = 0, unavailable = 0;
    for (uint64_t s = 0; s < c->slot_count; s++) {
        switch (c->in_use[s]) {
        case SLOT_HANDED_OUT:
            live++;
            TC_VCHECK(c->requested[s] > 0 && c->requested[s] <= c->slot_bytes);
            *requested += c->requested[s];
            break;
        case SLOT_LISTED:
            c->in_use[s] = SLOT_FREE;
            TC_VCHECK(c->requested[s] == 0);
            break;
        case SLOT_RETIRED:
        case SLOT_RESTORING:
            (*retired_bytes) += c->slot_bytes;
            /* fall through */
        case SLOT_RETIRING: /* its pages still count as locked and not retired, until they are given back */
            unavailable++;
            TC_VCHECK(c->requested[s] == 0);
            break;
        default:
            TC_VCHECK(0 && "slot neither handed out, nor on the free stack, nor retired");
        }
    }
    TC_VCHECK(unavailable == c->n_retired);
    TC_VCHECK(live == c->slot_count - c->n_free - c->n_retired);
    TC_VCHECK(c->peak_slots_in_use >= live && c->peak_slots_in_use <= c->slot_count);
    *live_slots += live;
    *live_bytes += live * c->slot_bytes;
    return ok;
}

int tc_arena_validate(const tc_arena_t* arena) {
    if (arena == NULL) return TC_EINVAL;
    int ok = 1;
    uint64_t live_slots = 0, live_bytes = 0, requested = 0, reserved = 0, locked = 0, retired = 0;
    arena_lock(arena);
    const tc_stats_t* s = &arena->stats;
    TC_VCHECK(arena->n_classes >= 1 && arena->n_classes <= TC_MAX_CLASSES);
    TC_VCHECK(s->n_classes == arena->n_classes && s->n_regions == arena->n_classes);
    for (uint32_t i = 0; ok && i < arena->n_classes; i++) {
        const tc_class_t* c = &arena->classes[i];
        TC_VCHECK(i == 0 || c->slot_bytes > arena->classes[i - 1].slot_bytes);
        const uint64_t retired_before = retired;
        if (!validate_class(c, &live_slots, &live_bytes, &requested, &retired)) ok = 0;
        reserved += c->region_bytes;
        if (c->locked) locked += c->region_bytes - (retired - retired_before);
    }
    if (ok) {
        TC_VCHECK(s->reserved == reserved && s->locked == locked && s->locked <= s->reserved);
        TC_VCHECK(s->retired == retired && s->retired <= s->reserved);
        TC_VCHECK(s->in_use == live_bytes && s->peak_in_use >= s->in_use && s->peak_in_use <= s->reserved);
        TC_VCHECK(s->in_use + s->retired <= s->reserved);
        TC_VCHECK(s->requested_in_use == requested && s->requested_in_use <= s->in_use);
        TC_VCHECK(s->allocs >= s->frees && s->allocs - s->frees == live_slots);
        TC_VCHECK(s->lock_fallbacks <= s->n_regions);
    }
    arena_unlock(arena);
    return ok ? TC_OK : TC_EINVAL;
}

void tc_arena_destroy(tc_arena_t* arena) {
    if (arena == NULL) return;
    for (uint32_t i = 0; i < arena->n_classes; i++) class_release(&arena->classes[i]);
    pthread_mutex_destroy(&arena->mutex);
    free(arena);
}

const char* tc_strerror(int code) {
    switch (code) {
    case TC_OK: return "success";
    case TC_EINVAL: return "invalid argument or broken arena invariant";
    case TC_ENOMEM: return "could not map the region (mmap failed) or allocate bookkeeping";
    case TC_ELOCK: return "could not page-lock a region (mlock failed; see RLIMIT_MEMLOCK) and locking is required";
    case TC_EEMPTY: return "no size class that fits has a free slot";
    case TC_ENOTOWNED: return "pointer is not a slot handed out by this arena (foreign pointer or double free)";
    case TC_ERELEASE:
        return "the kernel did not take a slot's pages back (munlock or madvise failed, e.g. at vm.max_map_count)";
    default: return "unknown tencache arena error";
    }
}

uint32_t tc_arena_abi_version(void) { return TC_ARENA_ABI_VERSION; }
