/* Tests of the native arena, without Python. Prints one line per failed check and a final
 * "N passed, N failed" line; exits 1 if anything failed. tests/memory/test_arena.py builds and runs it.
 *
 * Build and run by hand (asserts stay on: no -DNDEBUG):
 *   gcc -std=c11 -Wall -Wextra -I csrc/include csrc/arena.c csrc/tests/test_arena.c -lpthread -o /tmp/test_arena
 *   /tmp/test_arena
 * Add -fsanitize=address,undefined -g (or -fsanitize=thread) to run it under the sanitizers.
 */
#define _DEFAULT_SOURCE

#include "tencache/arena.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int n_passed = 0;
static int n_failed = 0;

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (cond) {                                                                \
            n_passed++;                                                            \
        } else {                                                                   \
            n_failed++;                                                            \
            printf("FAIL %s:%d in %s: %s\n", __FILE__, __LINE__, __func__, #cond); \
        }                                                                          \
    } while (0)

#define KiB 1024u

static tc_arena_t* make(const tc_class_spec_t* spec, uint32_t n) {
    tc_arena_t* a = NULL;
    int rc = tc_arena_create(spec, n, TC_LOCK_OFF, &a);
    CHECK(rc == TC_OK && a != NULL);
    return a;
}

static void test_invalid_arguments(void) {
    tc_arena_t* a = (tc_arena_t*)0x1;
    tc_class_spec_t ok = {4096, 1};
    tc_class_spec_t zero_bytes = {0, 1};
    tc_class_spec_t zero_count = {4096, 0};
    tc_class_spec_t too_many = {4096, (uint64_t)UINT32_MAX + 1};
    tc_class_spec_t many[TC_MAX_CLASSES + 1];
    for (uint32_t i = 0; i <= TC_MAX_CLASSES; i++) many[i] = (tc_class_spec_t){4096u * (i + 1), 1};
    CHECK(tc_arena_create(&ok, 1, TC_LOCK_OFF, NULL) == TC_EINVAL);
    CHECK(tc_arena_create(NULL, 1, TC_LOCK_OFF, &a) == TC_EINVAL && a == NULL);
    CHECK(tc_arena_create(&ok, 0, TC_LOCK_OFF, &a) == TC_EINVAL);
    CHECK(tc_arena_create(&ok, 1, 7, &a) == TC_EINVAL);
    CHECK(tc_arena_create(&zero_bytes, 1, TC_LOCK_OFF, &a) == TC_EINVAL);
    CHECK(tc_arena_create(&zero_count, 1, TC_LOCK_OFF, &a) == TC_EINVAL);
    CHECK(tc_arena_create(&too_many, 1, TC_LOCK_OFF, &a) == TC_EINVAL);
    CHECK(tc_arena_create(many, TC_MAX_CLASSES + 1, TC_LOCK_OFF, &a) == TC_EINVAL);
    CHECK(a == NULL);
    tc_arena_destroy(NULL); /* no-op */
    CHECK(tc_arena_validate(NULL) == TC_EINVAL);
}

static void test_rounding_merging_sorting(void) {
    /* 8192 x 1, 5000 -> 8192 (x 2), 100 -> 4096 (x 3), 4096 x 1: two classes {4096 x 4, 8192 x 3} */
    tc_class_spec_t spec[] = {{8192, 1}, {5000, 2}, {100, 3}, {4096, 1}};
    tc_arena_t* a = make(spec, 4);
    if (a == NULL) return;
    tc_stats_t s;
    CHECK(tc_arena_stats(a, &s) == TC_OK);
    CHECK(s.n_classes == 2 && s.n_regions == 2);
    CHECK(s.reserved == 4 * 4096 + 3 * 8192 && s.locked == 0 && s.in_use == 0);
    tc_class_stats_t c0, c1, bad;
    CHECK(tc_arena_class_stats(a, 0, &c0) == TC_OK && c0.slot_bytes == 4096 && c0.slot_count == 4);
    CHECK(tc_arena_class_stats(a, 1, &c1) == TC_OK && c1.slot_bytes == 8192 && c1.slot_count == 3);
    CHECK(tc_arena_class_stats(a, 2, &bad) == TC_EINVAL);
    void* base = NULL;
    uint64_t bytes = 0;
    CHECK(tc_arena_region(a, 1, &base, &bytes) == TC_OK && bytes == 3 * 8192 && (uintptr_t)base % 4096 == 0);
    CHECK(tc_arena_region(a, 2, &base, &bytes) == TC_EINVAL);
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

static void test_alignment_and_best_fit(void) {
    tc_class_spec_t spec[] = {{4 * KiB, 2}, {64 * KiB, 2}, {1024 * KiB, 1}};
    tc_arena_t* a = make(spec, 3);
    if (a == NULL) return;
    void* p = NULL;
    uint32_t cls = 99;
    CHECK(tc_arena_alloc(a, 1, &p, &cls) == TC_OK && cls == 0 && (uintptr_t)p % 4096 == 0);
    CHECK(tc_arena_alloc(a, 4096, &p, &cls) == TC_OK && cls == 0 && (uintptr_t)p % 4096 == 0);
    CHECK(tc_arena_alloc(a, 10, &p, &cls) == TC_OK && cls == 1); /* class 0 full: next larger */
    CHECK(tc_arena_alloc(a, 4097, &p, &cls) == TC_OK && cls == 1 && (uintptr_t)p % 4096 == 0);
    CHECK(tc_arena_alloc(a, 5000, &p, &cls) == TC_OK && cls == 2);
    CHECK(tc_arena_alloc(a, 1, &p, &cls) == TC_EEMPTY && p == NULL);
    CHECK(tc_arena_alloc(a, 0, &p, &cls) == TC_EINVAL);
    CHECK(tc_arena_alloc(a, 1, NULL, &cls) == TC_EINVAL);
    tc_stats_t s;
    tc_arena_stats(a, &s);
    CHECK(s.allocs == 5 && s.failed_allocs == 1);
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

static void test_too_large_is_empty(void) {
    tc_class_spec_t spec[] = {{8 * KiB, 4}};
    tc_arena_t* a = make(spec, 1);
    if (a == NULL) return;
    void* p = (void*)0x1;
    CHECK(tc_arena_alloc(a, 8 * KiB + 1, &p, NULL) == TC_EEMPTY && p == NULL);
    tc_arena_destroy(a);
}

static void test_reuse_and_bad_frees(void) {
    tc_class_spec_t spec[] = {{8 * KiB, 3}};
    tc_arena_t* a = make(spec, 1);
    if (a == NULL) return;
    void *p0, *p1, *p2;
    CHECK(tc_arena_alloc(a, 100, &p0, NULL) == TC_OK);
    CHECK(tc_arena_alloc(a, 100, &p1, NULL) == TC_OK);
    CHECK((uint8_t*)p1 == (uint8_t*)p0 + 8 * KiB); /* fresh arena: ascending addresses */
    CHECK(tc_arena_free(a, p0) == TC_OK);
    CHECK(tc_arena_alloc(a, 100, &p2, NULL) == TC_OK && p2 == p0); /* LIFO reuse */
    CHECK(tc_arena_free(a, p2) == TC_OK);
    CHECK(tc_arena_free(a, p2) == TC_ENOTOWNED);                      /* double free */
    CHECK(tc_arena_free(a, (uint8_t*)p1 + 4096) == TC_ENOTOWNED);      /* inside a slot */
    CHECK(tc_arena_free(a, (uint8_t*)p0 + 3 * 8 * KiB) == TC_ENOTOWNED); /* one past the region */
    int on_stack = 0;
    CHECK(tc_arena_free(a, &on_stack) == TC_ENOTOWNED);
    CHECK(tc_arena_free(a, NULL) == TC_ENOTOWNED);
    tc_stats_t s;
    tc_arena_stats(a, &s);
    CHECK(s.allocs == 3 && s.frees == 2 && s.in_use == 8 * KiB);
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

static void test_stats(void) {
    tc_class_spec_t spec[] = {{4 * KiB, 4}, {16 * KiB, 2}};
    tc_arena_t* a = make(spec, 2);
    if (a == NULL) return;
    void *p, *q, *r;
    tc_arena_alloc(a, 1000, &p, NULL);
    tc_arena_alloc(a, 10000, &q, NULL);
    tc_arena_alloc(a, 4096, &r, NULL);
    tc_stats_t s;
    tc_arena_stats(a, &s);
    CHECK(s.in_use == 4096 + 16384 + 4096 && s.requested_in_use == 1000 + 10000 + 4096);
    CHECK(s.peak_in_use == s.in_use);
    tc_arena_free(a, q);
    tc_arena_stats(a, &s);
    CHECK(s.in_use == 8192 && s.requested_in_use == 5096 && s.peak_in_use == 4096 + 16384 + 4096);
    tc_class_stats_t c;
    tc_arena_class_stats(a, 1, &c);
    CHECK(c.slots_in_use == 0 && c.peak_slots_in_use == 1 && c.locked == 0);
    tc_arena_class_stats(a, 0, &c);
    CHECK(c.slots_in_use == 2 && c.peak_slots_in_use == 2);
    /* Writes reach the memory (it is mapped read-write) and survive until the slot is reused. */
    memset(p, 0xab, 4096);
    CHECK(((uint8_t*)p)[4095] == 0xab);
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

static void test_lock_best_effort_reports_locked_bytes(void) {
    tc_class_spec_t spec[] = {{4 * KiB, 2}};
    tc_arena_t* a = NULL;
    CHECK(tc_arena_create(spec, 1, TC_LOCK_BEST_EFFORT, &a) == TC_OK);
    if (a == NULL) return;
    tc_stats_t s;
    tc_arena_stats(a, &s);
    /* Either 8 KiB got locked or the region counts as a fallback: never both, never neither. */
    CHECK((s.locked == 8 * KiB && s.lock_fallbacks == 0) || (s.locked == 0 && s.lock_fallbacks == 1));
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

static void test_retire_and_restore(void) {
    tc_class_spec_t spec[] = {{4 * KiB, 4}, {8 * KiB, 1}};
    tc_arena_t* a = NULL;
    CHECK(tc_arena_create(spec, 2, TC_LOCK_BEST_EFFORT, &a) == TC_OK);
    if (a == NULL) return;
    tc_stats_t before, s;
    tc_arena_stats(a, &before);
    void *held, *p;
    CHECK(tc_arena_alloc(a, 4096, &held, NULL) == TC_OK);
    /* Fill the free slots with a pattern, so that dropped pages show as zeros. */
    uint8_t* region = NULL;
    uint64_t region_bytes = 0;
    tc_arena_region(a, 0, (void**)&region, &region_bytes);
    for (uint64_t off = 0; off < region_bytes; off += 4096) {
        if (region + off != held) memset(region + off, 0x5a, 4096);
    }
    uint64_t n = 99;
    /* Only free slots are retired, however many are asked for; the held one keeps its bytes. */
    memset(held, 0x77, 4096);
    CHECK(tc_arena_retire(a, 0, 10, &n) == TC_OK && n == 3);
    CHECK(((uint8_t*)held)[4095] == 0x77);
    for (uint64_t off = 0; off < region_bytes; off += 4096) {
        if (region + off != held) CHECK(region[off] == 0 && region[off + 4095] == 0); /* pages given back */
    }
    tc_arena_stats(a, &s);
    CHECK(s.retired == 3 * 4096 && s.in_use == 4096);
    CHECK(s.locked == (before.locked ? before.locked - 3 * 4096 : 0));
    tc_class_stats_t c;
    tc_arena_class_stats(a, 0, &c);
    CHECK(c.slots_retired == 3 && c.slots_in_use == 1);
    /* A retired slot is neither handed out nor freeable; class 0 is full, so 4 KiB spill into class 1. */
    CHECK(tc_arena_free(a, region + (region == held ? 4096 : 0)) == TC_ENOTOWNED);
    uint32_t cls = 9;
    CHECK(tc_arena_alloc(a, 4096, &p, &cls) == TC_OK && cls == 1);
    CHECK(tc_arena_alloc(a, 4096, &p, NULL) == TC_EEMPTY);
    CHECK(tc_arena_validate(a) == TC_OK);
    /* Restore two: they come back free (locked again if the class is) and can be handed out. */
    CHECK(tc_arena_restore(a, 0, 2, &n) == TC_OK && n == 2);
    void *r1, *r2;
    CHECK(tc_arena_alloc(a, 100, &r1, &cls) == TC_OK && cls == 0);
    CHECK(tc_arena_alloc(a, 100, &r2, &cls) == TC_OK && cls == 0);
    memset(r1, 1, 4096);
    memset(r2, 2, 4096);
    tc_arena_stats(a, &s);
    CHECK(s.retired == 4096 && s.locked == (before.locked ? before.locked - 4096 : 0));
    CHECK(tc_arena_validate(a) == TC_OK);
    /* Restoring more than are retired restores what there is; retiring with nothing free retires nothing. */
    CHECK(tc_arena_restore(a, 0, 5, &n) == TC_OK && n == 1);
    CHECK(tc_arena_restore(a, 0, 5, &n) == TC_OK && n == 0);
    CHECK(tc_arena_alloc(a, 4096, &p, NULL) == TC_OK);
    CHECK(tc_arena_retire(a, 0, 1, &n) == TC_OK && n == 0);
    CHECK(tc_arena_retire(a, 2, 1, &n) == TC_EINVAL && n == 0);
    CHECK(tc_arena_restore(NULL, 0, 1, &n) == TC_EINVAL);
    tc_arena_stats(a, &s);
    CHECK(s.retired == 0 && s.locked == before.locked);
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

static void test_strerror(void) {
    for (int code = TC_OK; code <= TC_ERELEASE; code++)
        CHECK(strcmp(tc_strerror(code), "unknown tencache arena error") != 0);
    CHECK(strcmp(tc_strerror(12345), "unknown tencache arena error") == 0);
    CHECK(tc_arena_abi_version() == TC_ARENA_ABI_VERSION);
}

/* Deterministic stress: each thread owns the slots it holds (a private list), so a slot handed out twice at
 * once shows up as a tag written by another thread. */
#define STRESS_THREADS 4
#define STRESS_ITERS 20000
#define STRESS_HELD 8

typedef struct {
    tc_arena_t* arena;
    uint32_t seed;
    int errors;
    uint64_t allocs;  /* successful allocations */
} stress_arg_t;

static uint32_t xorshift(uint32_t* s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static void* stress_thread(void* argp) {
    stress_arg_t* arg = argp;
    void* held[STRESS_HELD] = {0};
    uint64_t tag[STRESS_HELD] = {0};
    for (uint32_t it = 0; it < STRESS_ITERS; it++) {
        uint32_t k = xorshift(&arg->seed) % STRESS_HELD;
        if (held[k] != NULL) {
            if (*(volatile uint64_t*)held[k] != tag[k]) arg->errors++;
            if (tc_arena_free(arg->arena, held[k]) != TC_OK) arg->errors++;
            held[k] = NULL;
        } else {
            uint64_t nbytes = 1 + xorshift(&arg->seed) % (20 * KiB);
            int rc = tc_arena_alloc(arg->arena, nbytes, &held[k], NULL);
            if (rc == TC_OK) {
                tag[k] = ((uint64_t)arg->seed << 32) | it;
                *(volatile uint64_t*)held[k] = tag[k];
                arg->allocs++;
            } else if (rc != TC_EEMPTY) {
                arg->errors++;
            }
        }
    }
    for (int k = 0; k < STRESS_HELD; k++) {
        if (held[k] != NULL && tc_arena_free(arg->arena, held[k]) != TC_OK) arg->errors++;
    }
    /* On a loaded machine the retirer can run alone long enough for every slot to be retired through all of this
     * thread's iterations (every alloc TC_EEMPTY, none checked): keep trying until the restorer, still running,
     * gives one back, so that each thread checks at least one slot. */
    for (uint32_t spins = 0; arg->allocs == 0 && spins < 100u * STRESS_ITERS; spins++) {
        void* p = NULL;
        int rc = tc_arena_alloc(arg->arena, 1, &p, NULL);
        if (rc == TC_OK) {
            *(volatile uint64_t*)p = arg->seed;
            if (*(volatile uint64_t*)p != arg->seed) arg->errors++;
            if (tc_arena_free(arg->arena, p) != TC_OK) arg->errors++;
            arg->allocs++;
        } else if (rc != TC_EEMPTY) {
            arg->errors++;
        } else {
            sched_yield();
        }
    }
    if (arg->allocs == 0) arg->errors++;
    return NULL;
}

/* One thread retires and another restores slots of every class while the stress threads allocate: a slot
 * retired while handed out, or restored while its pages are still being given back, would have its tag zeroed
 * and show up as an error in the thread that holds it. */
static atomic_int stress_done = 0;

static void* retire_thread(void* argp) {
    stress_arg_t* arg = argp;
    while (!stress_done) {
        uint64_t n;
        if (tc_arena_retire(arg->arena, xorshift(&arg->seed) % 3, 2, &n) != TC_OK) arg->errors++;
    }
    return NULL;
}

static void* restore_thread(void* argp) {
    stress_arg_t* arg = argp;
    while (!stress_done) {
        uint64_t n;
        if (tc_arena_restore(arg->arena, xorshift(&arg->seed) % 3, 3, &n) != TC_OK) arg->errors++;
        if (tc_arena_validate(arg->arena) != TC_OK) arg->errors++;
    }
    return NULL;
}

static void test_threads(void) {
    /* Fewer slots than 4 threads x 8 held, so TC_EEMPTY and class spill-over both happen. */
    tc_class_spec_t spec[] = {{4 * KiB, 6}, {8 * KiB, 6}, {32 * KiB, 6}};
    tc_arena_t* a = make(spec, 3);
    if (a == NULL) return;
    pthread_t threads[STRESS_THREADS], retirer, restorer;
    stress_arg_t args[STRESS_THREADS], retire_arg = {a, 88172645u, 0, 0}, restore_arg = {a, 521288629u, 0, 0};
    stress_done = 0;
    pthread_create(&retirer, NULL, retire_thread, &retire_arg);
    pthread_create(&restorer, NULL, restore_thread, &restore_arg);
    for (int t = 0; t < STRESS_THREADS; t++) {
        args[t] = (stress_arg_t){a, 2463534242u + 7919u * (uint32_t)t, 0, 0};
        pthread_create(&threads[t], NULL, stress_thread, &args[t]);
    }
    int errors = 0;
    for (int t = 0; t < STRESS_THREADS; t++) {
        pthread_join(threads[t], NULL);
        errors += args[t].errors;
    }
    stress_done = 1;
    pthread_join(retirer, NULL);
    pthread_join(restorer, NULL);
    CHECK(errors == 0 && retire_arg.errors == 0 && restore_arg.errors == 0);
    for (uint32_t cls = 0; cls < 3; cls++) {
        uint64_t n;
        CHECK(tc_arena_restore(a, cls, 100, &n) == TC_OK);
    }
    tc_stats_t s;
    tc_arena_stats(a, &s);
    CHECK(s.in_use == 0 && s.requested_in_use == 0 && s.allocs == s.frees && s.allocs > 0 && s.retired == 0);
    CHECK(s.failed_allocs > 0);
    CHECK(tc_arena_validate(a) == TC_OK);
    tc_arena_destroy(a);
}

int main(void) {
    test_invalid_arguments();
    test_rounding_merging_sorting();
    test_alignment_and_best_fit();
    test_too_large_is_empty();
    test_reuse_and_bad_frees();
    test_stats();
    test_lock_best_effort_reports_locked_bytes();
    test_retire_and_restore();
    test_strerror();
    test_threads();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
