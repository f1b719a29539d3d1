// simt/runtime.cpp — the SIMT emulator behind simt.h: CUDA threads as fibers, blocks on a
// pool of worker threads, device memory as bounds-checked host allocations, warp-collective
// operations, streams, events and graphs, and the checkers (docs/gpu.md, "GPU code without a GPU"):
//  - global memory: an access outside a live allocation, into a freed one, misaligned for its
//    size, or from host code (kernel, block, thread, address, allocation, source line; exit 3:
//    a GPU would fault there too);
//  - shared memory (static and dynamic): past the launch's dynamic size; a read of bytes no
//    thread of the block wrote; two threads touching the same bytes between two barriers, one
//    writing, not ordered by a warp-collective operation of their warp; a cp.async destination
//    read before its group was waited for (ptx.cpp);
//  - barriers reached by only part of a block or at different places; warp-collective operations
//    some lane of the mask does not reach, or reaches at another operation;
//  - launch configuration: block and grid limits, dynamic shared memory over 48 KiB without the
//    attribute, over 227 KiB at all.
// A finding fails the launch (cudaErrorLaunchFailure, sticky, as a GPU fault is) after up to 8
// reports. The kernel translation units are built with -fsanitize-coverage=trace-loads,
// trace-stores: the compiler calls __sanitizer_cov_load<N>/store<N> before every load and store
// with the address, and those land here. The emulator's own files are not instrumented.
#include "runtime.h"

#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <algorithm>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

extern "C" void simt_switch(void **save_sp, void *load_sp);
extern "C" void simt_fiber_entry();

namespace simt {

// ---- options and reports
// --------------------------------------------------------------------------

static int env_int(const char *name, int def) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : def;
}
static const int opt_checks = env_int("SIMT_CHECKS", 1); // 0: no shared-memory shadow
static const int opt_max_reports = 8;
static const char *const opt_profile = getenv("SIMT_PROFILE");
const int profiling = opt_profile && *opt_profile;
static const int opt_sample = env_int("SIMT_SAMPLE_BLOCKS", 0); // profiling: blocks run per launch

static std::mutex report_mu;

// "function at file:line" of a code address (addr2line on this executable, linked -no-pie): a
// return address (the call before it), or with entry set a function's own address.
static std::string symbolize(const void *pc, bool entry = false) {
    if (!pc) return "?";
    char cmd[256], line[1024];
    snprintf(cmd, sizeof cmd, "addr2line -f -C -i -e /proc/%d/exe %p 2>/dev/null", (int)getpid(),
             (const void *)((const char *)pc - (entry ? 0 : 1)));
    FILE *f = popen(cmd, "r");
    if (!f) return "?";
    std::string out;
    for (int n = 0; fgets(line, sizeof line, f); n++) {
        line[strcspn(line, "\n")] = 0;
        const char *base = strrchr(line, '/');
        if (n % 2 == 0)
            out += (n ? "\n     inlined into " : "") + std::string(line);
        else
            out += " at " + std::string(base ? base + 1 : line);
    }
    pclose(f);
    return out.empty() ? "?" : out;
}

// ---- device memory
// ----------------------------------------------------------------------------------

static const uintptr_t HEAP_SPAN = (uintptr_t)1 << 40; // reserved address space
static const int GRAN = 16;                            // granule: 64 KiB
static const size_t DEVICE_TOTAL = (size_t)80 << 30;   // reported as an H100's
static uintptr_t heap_lo, heap_cursor;
static uint32_t *gran_table; // granule -> allocation id (0: none)
static std::vector<allocation> allocs(1);
static size_t heap_used;
static std::mutex heap_mu;

static void heap_init() {
    if (heap_lo) return;
    void *p = mmap(NULL, HEAP_SPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *t = mmap(NULL, (HEAP_SPAN >> GRAN) * sizeof(uint32_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || t == MAP_FAILED) {
        fprintf(stderr, "simt: cannot reserve the emulated device's address space\n");
        exit(3);
    }
    gran_table = (uint32_t *)t;
    heap_lo = heap_cursor = (uintptr_t)p;
}

__attribute__((constructor)) static void heap_at_start() {
    heap_init();
} // before any access hook

static bool in_heap(uintptr_t a) {
    return a - heap_lo < HEAP_SPAN;
}

static const allocation *alloc_of(uintptr_t a) {
    if (!in_heap(a)) return NULL;
    uint32_t id = gran_table[(a - heap_lo) >> GRAN];
    return id ? &allocs[id] : NULL;
}

static size_t host_available() {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static std::string describe(uintptr_t a) {
    const allocation *al = alloc_of(a);
    if (!al) { // between allocations: name the nearest one below
        for (size_t i = allocs.size() - 1; i > 0; i--)
            if (allocs[i].base <= a) {
                al = &allocs[i];
                break;
            }
        if (!al) return "not in any allocation";
    }
    char buf[160];
    snprintf(buf, sizeof buf, "%zu bytes %s allocation #%u of %zu bytes%s, made ",
             (size_t)(a - al->base) - (a >= al->base + al->bytes ? al->bytes : 0),
             a >= al->base + al->bytes ? "past the end of" : "into", al->id, al->bytes,
             al->freed ? " (freed)" : "");
    return buf + symbolize(al->site);
}

int device_range(const void *p, size_t bytes, const char *what) {
    uintptr_t a = (uintptr_t)p;
    const allocation *al = alloc_of(a);
    if (al && !al->freed && a + bytes <= al->base + al->bytes) return 0;
    fprintf(stderr, "simt: %s: %zu bytes at %p are not inside one live device allocation (%s)\n",
            what, bytes, p, describe(a).c_str());
    return -1;
}

// ---- workers, fibers, blocks
// ------------------------------------------------------------------------

enum { UNSTARTED, READY, AT_COLL, AT_BAR, DONE };
static const int MAX_THREADS = 1024;
static const size_t DYN_MAX = 232448; // 227 KiB: the most dynamic shared memory a block may have
static const uint16_t TID_PENDING = 0x8000, TID_ATOMIC = 0x4000, TID_MASK = 0x3ff;
static const uint16_t R_WARP = 0x8000, R_MANY = 0xffff;

struct launch {
    simt_launch_site site;
    dim3 grid, block;
    size_t smem;
    std::function<void()> body;
    std::atomic<long> next{0};
    std::atomic<int> errors{0};
    long n_blocks, n_run; // blocks in the grid; blocks run (fewer when sampling)
};

struct cell { // the shadow of 2 bytes of shared memory
    uint32_t wB, wW, rB, rW;
    uint16_t wtid, rtid;
};
struct region {
    uintptr_t lo, span;
    cell *shadow;
};

struct worker;
struct thread_rec;
// The start of a fiber slot: the identity of the thread the fiber runs now (simt_self() reads
// pub). A fiber runs threads one after another while none of them blocks (a runner: one switch
// for a whole block of a kernel without barriers); a thread that blocks keeps the fiber.
struct fiber_hdr {
    simt_lane pub; // first
    thread_rec *t;
    worker *w;
};

struct thread_rec {
    uint3 idx;
    void *sp; // the saved stack pointer of its fiber, while it waits
    worker *w;
    int tid, warp, state;
    const void *site; // the pending scheduling point
    const char *what;
    unsigned mask;
    void *arg;
    simt_warp_fn op;
    int bar_kind, pred, result;
    std::vector<async_copy> open;                // cp.async not yet committed
    std::vector<std::vector<async_copy>> groups; // committed groups, oldest first
    std::vector<wgmma_pending> wg_open;              // wgmma.mma_async not yet committed
    std::vector<std::vector<wgmma_pending>> wg_groups; // committed, oldest first
    struct logged {                              // accesses since the warp's last request count
        const void *site;
        uintptr_t a;
        uint32_t n;
        bool shared;
    };
    std::vector<logged> log;
};

struct worker {
    unsigned char *slots; // MAX_THREADS fiber slots of SIMT_SLOT bytes
    std::vector<thread_rec> threads;
    int next_start, n_fibers; // the next thread no fiber has started; fibers in use
    void *sched_sp;
    unsigned char *dyn; // dynamic shared memory: DYN_MAX bytes, then a guard page
    region dyn_r, tls_r;
    uint32_t B, block_B0, W[MAX_THREADS / 32];
    simt_block_info blk;
    launch *L;
    int n_threads;
    thread_rec *op_lanes[32];
    counters ctr;
};

static thread_local worker *cur; // the worker this OS thread is running blocks for
static std::vector<worker *> pool;

static thread_rec *slot(worker *w, int tid) {
    return &w->threads[tid];
}
static fiber_hdr *fiber(worker *w, int i) {
    return (fiber_hdr *)(w->slots + (size_t)i * SIMT_SLOT);
}

static void *map_rw(size_t bytes, const char *what) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "simt: cannot map %s (%zu bytes)\n", what, bytes);
        exit(3);
    }
    return p;
}

// The executable's static TLS block of this OS thread, [tp - size, tp) (x86-64 glibc, TLS
// variant II): every __shared__ variable lives there (simt.h), and kernel code touches nothing
// else in it.
static int tls_size_cb(struct dl_phdr_info *info, size_t, void *data) {
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            size_t al = info->dlpi_phdr[i].p_align ? info->dlpi_phdr[i].p_align : 1;
            *(size_t *)data = (info->dlpi_phdr[i].p_memsz + al - 1) / al * al;
        }
    return 1; // the first object is the executable
}
static thread_local int tls_probe;
static void tls_window(region *r) {
    static const size_t size = [] {
        size_t n = 0;
        dl_iterate_phdr(tls_size_cb, &n);
        return n;
    }();
    uintptr_t tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    if ((uintptr_t)&tls_probe - (tp - size) >= size) {
        fprintf(stderr, "simt: the executable's TLS block is not where x86-64 glibc puts it\n");
        exit(3);
    }
    if (!r->shadow) r->shadow = (cell *)map_rw((size / 2 + 1) * sizeof(cell), "a shadow");
    r->lo = tp - size, r->span = size;
}

static worker *worker_new() {
    worker *w = new worker();
    const size_t page = 4096, desc = (sizeof(fiber_hdr) + page - 1) / page * page;
    unsigned char *raw = (unsigned char *)mmap(NULL, (MAX_THREADS + 1) * SIMT_SLOT, PROT_NONE,
                                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) exit(3);
    w->slots = (unsigned char *)(((uintptr_t)raw + SIMT_SLOT - 1) & ~(SIMT_SLOT - 1));
    for (int i = 0; i < MAX_THREADS; i++) { // descriptor, a guard page, the stack
        unsigned char *s = w->slots + (size_t)i * SIMT_SLOT;
        if (mprotect(s, desc, PROT_READ | PROT_WRITE) ||
            mprotect(s + desc + page, SIMT_SLOT - desc - page, PROT_READ | PROT_WRITE))
            exit(3);
        new (s) fiber_hdr();
    }
    w->threads.resize(MAX_THREADS);
    w->dyn = (unsigned char *)map_rw(DYN_MAX + page, "dynamic shared memory");
    mprotect(w->dyn + DYN_MAX, page, PROT_NONE);
    w->dyn_r = {(uintptr_t)w->dyn, 0, (cell *)map_rw(DYN_MAX / 2 * sizeof(cell), "a shadow")};
    w->B = 1;
    return w;
}

// The thread whose fiber is running, or NULL off the fibers (host code, the scheduler).
static thread_rec *current_thread() {
    worker *w = cur;
    if (!w) return NULL;
    uintptr_t sp;
    __asm__("mov %%rsp, %0" : "=r"(sp));
    if (sp - (uintptr_t)w->slots >= (uintptr_t)MAX_THREADS * SIMT_SLOT) return NULL;
    return ((fiber_hdr *)(sp & ~(SIMT_SLOT - 1)))->t;
}

thread_rec *self_or_die(const char *what) {
    thread_rec *t = current_thread();
    if (!t) {
        fprintf(stderr, "simt: %s called outside a kernel\n", what);
        exit(3);
    }
    return t;
}

thread_rec *op_lane(int l) {
    return cur ? cur->op_lanes[l] : NULL;
}
std::vector<async_copy> &async_open(thread_rec *t) {
    return t->open;
}
std::vector<std::vector<async_copy>> &async_groups(thread_rec *t) {
    return t->groups;
}
int warp_index(thread_rec *t) {
    return t->warp;
}
int block_threads() {
    return cur ? cur->n_threads : 0;
}
std::vector<wgmma_pending> &wgmma_open(thread_rec *t) {
    return t->wg_open;
}
std::vector<std::vector<wgmma_pending>> &wgmma_groups(thread_rec *t) {
    return t->wg_groups;
}

// ---- findings
// ----------------------------------------------------------------------------------------

static std::atomic<int> sticky{0}, last{0};
void fail_sticky(cudaError_t e) {
    int z = 0;
    sticky.compare_exchange_strong(z, (int)e);
}

static void vfinding(worker *w, thread_rec *t, const void *site, const char *fmt, va_list ap) {
    launch *L = w ? w->L : NULL;
    if (L && L->errors.fetch_add(1) >= opt_max_reports) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    std::lock_guard<std::mutex> g(report_mu);
    fprintf(stderr, "simt: %s\n", msg);
    if (L)
        fprintf(stderr, "  kernel %s, launched at %s:%d, block (%u,%u,%u)", L->site.name,
                L->site.file, L->site.line, w->blk.block_idx.x, w->blk.block_idx.y,
                w->blk.block_idx.z);
    if (L && t) fprintf(stderr, ", thread (%u,%u,%u)", t->idx.x, t->idx.y, t->idx.z);
    if (site) fprintf(stderr, "\n  at %s", symbolize(site).c_str());
    fprintf(stderr, "\n");
    fflush(stderr);
}

static void finding(worker *w, thread_rec *t, const void *site, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void finding(worker *w, thread_rec *t, const void *site, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfinding(w, t, site, fmt, ap);
    va_end(ap);
}

void finding_at(thread_rec *t, const void *site, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfinding(t ? t->w : cur, t, site, fmt, ap);
    va_end(ap);
}

[[noreturn]] static void fault() {
    fprintf(stderr, "simt: stopped at the invalid global access above (a GPU faults there too: "
                    "cudaErrorIllegalAddress)\n");
    fflush(stderr);
    _exit(3);
}

// ---- access checks
// -----------------------------------------------------------------------------------

enum { A_READ, A_WRITE, A_ATOMIC, A_ASYNC, A_LANDED };
static const char *const access_names[] = {"read", "write", "atomic", "cp.async", "cp.async"};

static void global_check(worker *w, thread_rec *t, uintptr_t a, size_t n, int kind,
                         const void *site) {
    const char *verb = access_names[kind];
    if (!t) {
        finding(w, NULL, site,
                "host code %s of %zu bytes of device memory at %p (%s): only kernels "
                "and cudaMemcpy touch device memory",
                verb, n, (void *)a, describe(a).c_str());
        fault();
    }
    const allocation *al = alloc_of(a);
    if (!al || al->freed || a + n > al->base + al->bytes) {
        finding(w, t, site, "invalid global %s of %zu bytes at %p: %s", verb, n, (void *)a,
                describe(a).c_str());
        fault();
    }
    if (n > 1 && a % n) {
        finding(w, t, site, "misaligned global %s of %zu bytes at %p (%s)", verb, n, (void *)a,
                describe(a).c_str());
        fault();
    }
    w->ctr.global_bytes += n;
}

static bool ordered(worker *w, thread_rec *t, uint16_t other, uint32_t other_W) {
    return (int)(other & TID_MASK) / 32 == t->warp && other_W < w->W[t->warp];
}

static int reader_warp(uint16_t rtid) {
    return rtid == R_MANY ? -1 : rtid & R_WARP ? rtid & 0x7fff : rtid / 32;
}

static void shared_check(worker *w, thread_rec *t, region &r, uintptr_t a, size_t n, int kind,
                         const void *site) {
    const size_t off = a - r.lo;
    if (n > 1 && a % n && kind < A_ASYNC) {
        finding(w, t, site, "misaligned shared %s of %zu bytes at offset %zu", access_names[kind],
                n, off);
        return;
    }
    if (kind == A_READ)
        w->ctr.shared_read_bytes += n;
    else if (kind != A_LANDED)
        w->ctr.shared_write_bytes += n;
    if (!opt_checks) return;
    const uint32_t B = w->B, Wt = w->W[t->warp];
    for (uintptr_t g = off / 2; g <= (off + n - 1) / 2; g++) {
        cell &c = r.shadow[g];
        const bool written = c.wB >= w->block_B0;
        const int wt = c.wtid & TID_MASK;
        const bool other_now = written && c.wB == B && wt != t->tid && !ordered(w, t, c.wtid, c.wW);
        if (kind == A_READ) {
            if (c.rB == B && c.rtid == t->tid && (c.wB != B || c.wtid == t->tid))
                continue; // read by this thread since the barrier, nothing written since but its
                          // own
            if (!written) {
                finding(w, t, site,
                        "read of shared memory that no thread of this block wrote "
                        "(offset %zu, %zu bytes)",
                        off, n);
                return;
            }
            if (c.wtid & TID_PENDING) {
                finding(w, t, site,
                        "read of a cp.async destination before its group was waited for "
                        "(offset %zu; the copy is thread %d's)",
                        (size_t)g * 2, wt);
                return;
            }
            if (other_now) {
                finding(w, t, site,
                        "shared-memory race: read of offset %zu, which thread %d wrote "
                        "since the last barrier",
                        (size_t)g * 2, wt);
                return;
            }
            if (c.rB != B)
                c.rB = B, c.rtid = (uint16_t)t->tid, c.rW = Wt;
            else if (c.rtid != t->tid) {
                c.rtid = reader_warp(c.rtid) == t->warp ? (uint16_t)(R_WARP | t->warp) : R_MANY;
                c.rW = c.rW > Wt ? c.rW : Wt;
            }
            continue;
        }
        if (kind == A_LANDED) { // a cp.async copy lands: the issuing thread's write, now
            c.wB = B, c.wtid = (uint16_t)t->tid, c.wW = Wt;
            continue;
        }
        if (other_now && !(kind == A_ATOMIC && (c.wtid & TID_ATOMIC))) {
            finding(w, t, site,
                    "shared-memory race: %s of offset %zu, which thread %d wrote since "
                    "the last barrier",
                    access_names[kind], (size_t)g * 2, wt);
            return;
        }
        if (c.rB == B && c.rB >= w->block_B0 && c.rtid != t->tid &&
            !(reader_warp(c.rtid) == t->warp && c.rW < Wt)) {
            finding(w, t, site,
                    "shared-memory race: %s of offset %zu, which %s read since the last "
                    "barrier",
                    access_names[kind], (size_t)g * 2,
                    c.rtid == R_MANY ? "threads of several warps" : "another thread");
            return;
        }
        c.wB = B, c.wW = Wt;
        c.wtid = (uint16_t)(t->tid | (kind == A_ATOMIC ? TID_ATOMIC : 0) |
                            (kind == A_ASYNC ? TID_PENDING : 0));
    }
}

static region *shared_region(worker *w, uintptr_t a) {
    if (a - w->dyn_r.lo < DYN_MAX + 4096) return &w->dyn_r;
    if (a - w->tls_r.lo < w->tls_r.span) return &w->tls_r;
    return NULL;
}

// Any access of n bytes at a by thread t: device memory, the block's shared memory, or neither
// (the thread's own stack, host memory of the emulator: not checked).
static void access(worker *w, thread_rec *t, uintptr_t a, size_t n, int kind, const void *site) {
    if (in_heap(a)) {
        global_check(w, t, a, n, kind, site);
        if (profiling && kind != A_LANDED) t->log.push_back({site, a, (uint32_t)n, false});
        return;
    }
    if (!t || !w) return;
    region *r = shared_region(w, a);
    if (!r) return;
    if (profiling && kind != A_LANDED) t->log.push_back({site, a, (uint32_t)n, true});
    if (r == &w->dyn_r && a + n > r->lo + r->span) {
        finding(w, t, site,
                "shared %s of %zu bytes at dynamic offset %zu, past the launch's %zu "
                "bytes of dynamic shared memory",
                access_names[kind], n, (size_t)(a - r->lo), r->span);
        return;
    }
    shared_check(w, t, *r, a, n, kind, site);
}

static inline void hook(const void *p, size_t n, int kind, const void *site) {
    uintptr_t a = (uintptr_t)p;
    worker *w = cur;
    if (!in_heap(a) && !w) return; // host code on host memory: the common case off kernels
    thread_rec *t = current_thread();
    if (!t && !in_heap(a)) return;
    access(w, t, a, n, kind, site);
}

bool is_shared(const void *p) {
    return cur && shared_region(cur, (uintptr_t)p) != NULL;
}
bool is_global(const void *p) {
    return in_heap((uintptr_t)p);
}

void check_access(thread_rec *t, const void *p, size_t n, int write, const void *site) {
    access(cur, t ? t : current_thread(), (uintptr_t)p, n, write ? A_WRITE : A_READ, site);
}

void check_async(thread_rec *t, const void *p, size_t n, bool landed, const void *site) {
    worker *w = cur;
    region *r = shared_region(w, (uintptr_t)p);
    if (!r) {
        finding(w, t, site, "cp.async destination %p is not shared memory", p);
        return;
    }
    access(w, t, (uintptr_t)p, n, landed ? A_LANDED : A_ASYNC, site);
}

} // namespace simt

using namespace simt;

extern "C" {
#define SIMT_HOOKS(N, T)                                                                           \
    void __sanitizer_cov_load##N(T *p) {                                                           \
        hook(p, N, A_READ, __builtin_return_address(0));                                           \
    }                                                                                              \
    void __sanitizer_cov_store##N(T *p) {                                                          \
        hook(p, N, A_WRITE, __builtin_return_address(0));                                          \
    }
SIMT_HOOKS(1, uint8_t)
SIMT_HOOKS(2, uint16_t)
SIMT_HOOKS(4, uint32_t)
SIMT_HOOKS(8, uint64_t)
SIMT_HOOKS(16, __int128)
#undef SIMT_HOOKS
// -fsanitize-coverage emits the load/store hooks only with a coverage kind (func); its
// per-function guard calls land here and do nothing.
void __sanitizer_cov_trace_pc_guard_init(uint32_t *, uint32_t *) {}
void __sanitizer_cov_trace_pc_guard(uint32_t *) {}
}

void simt_atomic_check(const void *p, size_t size) {
    access(cur, current_thread(), (uintptr_t)p, size, A_ATOMIC, __builtin_return_address(0));
}

void *simt_dynamic_shared() {
    return (void *)self_or_die("dynamic shared memory")->w->dyn;
}

// Shared addresses as PTX sees them: the launch's dynamic shared memory from 0 (so that a
// wgmma descriptor's 18-bit address reaches all of it), the static (thread_local) shared
// variables after DYN_MAX. A GPU puts static first; no kernel may depend on the order.
size_t simt_shared_offset(const void *p) {
    thread_rec *t = self_or_die("__cvta_generic_to_shared");
    worker *w = t->w;
    uintptr_t a = (uintptr_t)p;
    if (a - w->dyn_r.lo < DYN_MAX) return a - w->dyn_r.lo;
    if (a - w->tls_r.lo < w->tls_r.span) return DYN_MAX + (a - w->tls_r.lo);
    finding(w, t, __builtin_return_address(0), "%p is not a shared-memory address", p);
    return 0;
}

void *simt::shared_at(uint32_t off) {
    worker *w = cur;
    if (!w) return NULL;
    if (off < w->dyn_r.span) return (void *)(w->dyn_r.lo + off);
    if (off >= DYN_MAX && off - DYN_MAX < w->tls_r.span) return (void *)(w->tls_r.lo + (off - DYN_MAX));
    return NULL;
}

// ---- scheduling points
// -------------------------------------------------------------------------------

static void block_on(thread_rec *t, int state) {
    t->state = state;
    simt_switch(&t->sp, t->w->sched_sp);
}

static int barrier(int kind, int pred, const void *site) {
    thread_rec *t = self_or_die("__syncthreads");
    t->site = site, t->bar_kind = kind, t->pred = pred;
    block_on(t, AT_BAR);
    return t->result;
}

void __syncthreads() {
    barrier(0, 0, __builtin_return_address(0));
}
int __syncthreads_or(int pred) {
    return barrier(1, pred != 0, __builtin_return_address(0));
}
int __syncthreads_and(int pred) {
    return barrier(2, pred != 0, __builtin_return_address(0));
}

static void warp_op_at(const char *what, unsigned mask, void *arg, simt_warp_fn op,
                       const void *site) {
    thread_rec *t = self_or_die(what);
    t->what = what, t->mask = mask, t->arg = arg, t->op = op, t->site = site;
    block_on(t, AT_COLL);
}

void simt_warp_op(const char *what, unsigned mask, void *arg, simt_warp_fn op) {
    warp_op_at(what, mask, arg, op, __builtin_return_address(0));
}

static void nop_op(void *const *, unsigned) {}
void __syncwarp(unsigned mask) {
    warp_op_at("__syncwarp", mask, NULL, nop_op, __builtin_return_address(0));
}

namespace {
struct shfl_arg {
    uint64_t in, out;
    int kind, arg, width;
};
// shfl.sync as the PTX ISA's pseudo-code defines it, with the c operand CUDA's __shfl_*_sync
// pass for a width w: segmask = 32 - w (bits 12:8 of c), clamp 0 for .up and 31 otherwise:
//   maxLane = (lane & segmask) | (clamp & ~segmask), minLane = lane & segmask;
//   .up j = lane - b (valid iff j >= maxLane); .down j = lane + b (j <= maxLane);
//   .bfly j = lane ^ b (j <= maxLane); .idx j = minLane | (b & ~segmask) (j <= maxLane);
//   invalid: j = lane (the lane's own value). b is the operand's low 5 bits.
// So a butterfly whose mask reaches past the width reads a lower segment's lane (j <= maxLane
// holds there), where "outside the segment: own value" would not.
void shfl_op(void *const *args, unsigned mask) {
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        shfl_arg *a = (shfl_arg *)args[l];
        const int segmask = (32 - a->width) & 31, clamp = a->kind == SIMT_SHFL_UP ? 0 : 31;
        const int maxl = (l & segmask) | (clamp & ~segmask), minl = l & segmask, b = a->arg & 31;
        int src;
        bool valid;
        switch (a->kind) {
        case SIMT_SHFL_IDX:
            src = minl | (b & ~segmask), valid = src <= maxl;
            break;
        case SIMT_SHFL_XOR:
            src = l ^ b, valid = src <= maxl;
            break;
        case SIMT_SHFL_UP:
            src = l - b, valid = src >= maxl;
            break;
        default:
            src = l + b, valid = src <= maxl;
            break;
        }
        if (!valid) src = l;
        if (!(mask >> src & 1)) {
            thread_rec *t = op_lane(l);
            finding_at(t, t->site,
                       "shuffle by lane %d reads lane %d, outside the mask 0x%08x "
                       "(an undefined value on a GPU)",
                       l, src, mask);
            a->out = 0;
            continue;
        }
        a->out = ((shfl_arg *)args[src])->in;
    }
}
} // namespace

uint64_t simt_shfl(unsigned mask, uint64_t v, int kind, int arg, int width) {
    shfl_arg a = {v, 0, kind, arg, width};
    if (width < 1 || width > 32 || (width & (width - 1))) {
        thread_rec *t = self_or_die("shuffle");
        finding_at(t, __builtin_return_address(0), "shuffle width %d is not a power of 2 <= 32",
                   width);
        a.width = 32;
    }
    warp_op_at("shuffle", mask, &a, shfl_op, __builtin_return_address(0));
    return a.out;
}

// ---- the block scheduler
// -------------------------------------------------------------------------------

namespace simt {

static void finish_thread(thread_rec *t) {
    for (auto &g : t->groups)
        async_complete(t, g); // copies still in flight land now
    t->groups.clear();
    if (!t->open.empty()) async_complete(t, t->open);
    for (auto &g : t->wg_groups) wgmma_complete(t, g);
    t->wg_groups.clear();
    t->wg_open.clear();
    t->state = DONE;
}

// A runner: starts the block's next unstarted thread, runs it to its end, takes the next, and
// so on; once one of its threads blocks, the scheduler starts another runner for the rest.
static void runner_main(fiber_hdr *f) {
    worker *w = f->w;
    while (w->next_start < w->n_threads) {
        thread_rec *t = &w->threads[w->next_start++];
        f->t = t, f->pub.thread_idx = t->idx;
        t->state = READY;
        w->L->body();
        finish_thread(t);
    }
    f->t = NULL;
    void *dead;
    simt_switch(&dead, w->sched_sp);
    __builtin_unreachable();
}

// A fresh runner fiber in the next free slot: its first switch "returns" into
// simt_fiber_entry(runner_main, f) (switch.S). Stack top 16-aligned; MXCSR and the x87 control
// word at their defaults.
static void start_runner(worker *w) {
    fiber_hdr *f = fiber(w, w->n_fibers++);
    f->w = w, f->t = NULL, f->pub.blk = &w->blk;
    uint64_t *s = (uint64_t *)(((uintptr_t)f + SIMT_SLOT) & ~(uintptr_t)15);
    s[-1] = (uint64_t)(uintptr_t)simt_fiber_entry; // ret target
    s[-2] = 0;                                     // rbp
    s[-3] = 0;                                     // rbx
    s[-4] = (uint64_t)(uintptr_t)f;                // r12: the argument
    s[-5] = (uint64_t)(uintptr_t)runner_main;      // r13: the function
    s[-6] = 0, s[-7] = 0;                          // r14, r15
    s[-8] = 0x1f80 | (uint64_t)0x037f << 32;       // MXCSR, x87 control word
    simt_switch(&w->sched_sp, &s[-8]);
}

static void resume(worker *w, thread_rec *t) {
    simt_switch(&w->sched_sp, t->sp);
}

void profile_count(double counters::*field, double n) {
    if (cur) cur->ctr.*field += n;
}

// Profiling: the accesses the lanes [lo, hi) logged since the last count, grouped into requests
// (the k-th execution of one instruction by each lane): shared-memory wavefronts (the most
// distinct 4-byte words any bank serves in a phase: 32 lanes of <= 4 bytes, 16 of 8, 8 of 16)
// and global 32-byte sectors.
static void count_requests(worker *w, int lo, int hi) {
    struct acc {
        int lane;
        uintptr_t a;
        uint32_t n;
    };
    std::map<std::pair<const void *, int>, std::pair<bool, std::vector<acc>>> req;
    for (int i = lo; i < hi; i++) {
        thread_rec *t = slot(w, i);
        std::map<const void *, int> seen;
        for (const auto &e : t->log) {
            auto &r = req[{e.site, seen[e.site]++}];
            r.first = e.shared;
            r.second.push_back({i - lo, e.a, e.n});
        }
        t->log.clear();
    }
    for (auto &kv : req) {
        const std::vector<acc> &v = kv.second.second;
        if (!kv.second.first) {
            std::vector<uintptr_t> sectors;
            for (const acc &x : v)
                for (uintptr_t s = x.a / 32; s <= (x.a + x.n - 1) / 32; s++)
                    sectors.push_back(s);
            std::sort(sectors.begin(), sectors.end());
            w->ctr.global_requests++;
            w->ctr.global_sectors += std::unique(sectors.begin(), sectors.end()) - sectors.begin();
            continue;
        }
        uint32_t size = 1;
        for (const acc &x : v)
            size = x.n > size ? x.n : size;
        const int per_phase = size <= 4 ? 32 : size == 8 ? 16 : 8;
        for (int ph = 0; ph < 32 / per_phase; ph++) {
            std::map<int, std::vector<uintptr_t>> banks;
            for (const acc &x : v)
                if (x.lane / per_phase == ph)
                    for (uintptr_t word = x.a / 4; word <= (x.a + x.n - 1) / 4; word++)
                        banks[(int)(word % 32)].push_back(word);
            size_t most = 0;
            for (auto &b : banks) {
                std::sort(b.second.begin(), b.second.end());
                size_t d = std::unique(b.second.begin(), b.second.end()) - b.second.begin();
                most = d > most ? d : most;
            }
            if (most) w->ctr.shared_wavefronts += most;
        }
        w->ctr.shared_requests++;
    }
}

// Runs warp `wp` until every lane waits at a block barrier or has finished: each ready lane runs
// to its next scheduling point; a warp operation runs once all lanes of its mask reach it.
// false after a finding that leaves the block unable to go on.
static bool run_warp(worker *w, int wp) {
    const int lo = wp * 32, hi = lo + 32 < w->n_threads ? lo + 32 : w->n_threads;
    for (;;) {
        for (int i = lo; i < hi; i++) {
            thread_rec *t = slot(w, i);
            if (t->state == UNSTARTED) start_runner(w); // it starts t (and maybe more)
            if (t->state == READY) resume(w, t);
        }
        thread_rec *first = NULL;
        for (int i = lo; i < hi && !first; i++)
            if (slot(w, i)->state == AT_COLL) first = slot(w, i);
        if (profiling) count_requests(w, lo, hi);
        if (!first) return true;
        const unsigned mask = first->mask;
        void *args[32] = {0};
        for (int l = 0; l < 32; l++) {
            thread_rec *t = lo + l < hi ? slot(w, lo + l) : NULL;
            w->op_lanes[l] = t;
            if (!(mask >> l & 1)) continue;
            const char *why =
                !t                   ? "does not exist (the block's last warp is short)"
                : t->state == DONE   ? "has exited"
                : t->state == AT_BAR ? "waits at a block barrier"
                : t->op != first->op || t->mask != mask         ? "waits at another warp operation"
                : t->site != first->site && first->op != nop_op ? "reaches it at another place"
                                                                : NULL;
            if (why) {
                finding(w, first, first->site, "%s with mask 0x%08x: lane %d %s", first->what, mask,
                        l, why);
                return false;
            }
            args[l] = t->arg;
        }
        first->op(args, mask);
        if (profiling) count_requests(w, lo, hi); // the operation's own accesses (ldmatrix)
        w->W[wp]++;
        w->ctr.warp_ops++;
        for (int l = 0; l < 32; l++)
            if (mask >> l & 1) slot(w, lo + l)->state = READY;
    }
}

static void run_block(worker *w, launch *L, long b) {
    const dim3 g = L->grid, bd = L->block;
    w->blk.block_idx = {(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / g.x / g.y)};
    w->blk.block_dim = bd, w->blk.grid_dim = g;
    w->n_threads = (int)(bd.x * bd.y * bd.z);
    const int n_warps = (w->n_threads + 31) / 32;
    w->block_B0 = ++w->B;
    for (int i = 0; i < n_warps; i++)
        w->W[i] = 1;
    w->dyn_r.span = L->smem;
    memset(w->dyn, 0xff, L->smem); // what a block finds in shared memory: not zeros
    for (int i = 0; i < w->n_threads; i++) {
        thread_rec *t = slot(w, i);
        t->idx = {(unsigned)(i % bd.x), (unsigned)(i / bd.x % bd.y), (unsigned)(i / bd.x / bd.y)};
        t->w = w, t->tid = i, t->warp = i / 32, t->state = UNSTARTED;
        t->open.clear(), t->groups.clear();
    }
    w->next_start = 0, w->n_fibers = 0;
    w->ctr.blocks++, w->ctr.threads += w->n_threads;
    for (;;) {
        for (int wp = 0; wp < n_warps; wp++)
            if (!run_warp(w, wp)) return;
        int done = 0;
        thread_rec *at = NULL;
        for (int i = 0; i < w->n_threads; i++) {
            thread_rec *t = slot(w, i);
            if (t->state == DONE)
                done++;
            else if (!at)
                at = t;
        }
        if (done == w->n_threads) return;
        if (done) {
            finding(w, at, at->site,
                    "barrier reached by only part of the block: %d of %d threads "
                    "exited before it",
                    done, w->n_threads);
            return;
        }
        int any = 0, all = 1;
        for (int i = 0; i < w->n_threads; i++) {
            thread_rec *t = slot(w, i);
            if (t->site != at->site || t->bar_kind != at->bar_kind) {
                finding(w, t, t->site,
                        "threads %d and %d wait at different barriers (a barrier "
                        "must be reached by the whole block at the same place)",
                        at->tid, t->tid);
                return;
            }
            any |= t->pred, all &= t->pred;
        }
        for (int i = 0; i < w->n_threads; i++) {
            thread_rec *t = slot(w, i);
            t->result = at->bar_kind == 1 ? any : at->bar_kind == 2 ? all : 0;
            t->state = READY;
        }
        w->B++;
        w->ctr.barriers++;
    }
}

// ---- the worker pool
// ------------------------------------------------------------------------------------

// Never destroyed: the workers wait on them until the process ends.
static std::mutex &pool_mu = *new std::mutex;
static std::condition_variable &pool_cv = *new std::condition_variable,
                               &done_cv = *new std::condition_variable;
static launch *pool_job;
static long pool_gen;
static int pool_busy;

static void work_on(worker *w, launch *L) {
    cur = w;
    tls_window(&w->tls_r);
    w->L = L;
    for (long j; (j = L->next.fetch_add(1)) < L->n_run;) {
        if (L->errors.load() > 0) break; // a finding: the rest of the grid is not run
        run_block(w, L, L->n_run == L->n_blocks ? j : j * L->n_blocks / L->n_run);
    }
    w->L = NULL;
    cur = NULL;
}

static void pool_main(worker *w) {
    long seen = 0;
    for (;;) {
        launch *L;
        {
            std::unique_lock<std::mutex> lk(pool_mu);
            pool_cv.wait(lk, [&] { return pool_gen != seen; });
            seen = pool_gen, L = pool_job;
        }
        work_on(w, L);
        std::lock_guard<std::mutex> lk(pool_mu);
        if (--pool_busy == 0) done_cv.notify_all();
    }
}

static void pool_init() {
    if (!pool.empty()) return;
    unsigned n = (unsigned)env_int("SIMT_WORKERS", (int)std::thread::hardware_concurrency());
    n = n < 1 ? 1 : n > 16 ? 16 : n;
    for (unsigned i = 0; i < n; i++)
        pool.push_back(worker_new());
    for (unsigned i = 1; i < n; i++)
        std::thread(pool_main, pool[i]).detach();
}

// Profiling: every kernel's counters, summed over its launches, written at exit.
struct kernel_profile {
    const char *name;
    double launches, threads_per_block, dyn_smem, grid_blocks;
    counters c;
};
static std::map<const void *, kernel_profile> &profiles =
    *new std::map<const void *, kernel_profile>;

static void profile_write() {
    FILE *f = fopen(opt_profile, "w");
    if (!f) {
        fprintf(stderr, "simt: cannot write the profile %s\n", opt_profile);
        return;
    }
    fprintf(f, "[\n");
    size_t i = 0;
    for (auto &kv : profiles) {
        const kernel_profile &k = kv.second;
        std::string fn = symbolize(kv.first, true);
        fn = fn.substr(0, fn.find(" at "));
        for (char &ch : fn)
            ch = ch == '"' ? '\'' : ch;
        fprintf(f,
                "  {\"kernel\": \"%s\", \"launch\": \"%s\", \"launches\": %.0f, "
                "\"threads_per_block\": %.0f, \"dyn_smem\": %.0f, \"grid_blocks\": %.0f",
                fn.c_str(), k.name, k.launches, k.threads_per_block, k.dyn_smem, k.grid_blocks);
        static const char *const names[] = {"blocks",
                                            "threads",
                                            "barriers",
                                            "warp_ops",
                                            "global_bytes",
                                            "shared_read_bytes",
                                            "shared_write_bytes",
                                            "shared_requests",
                                            "shared_wavefronts",
                                            "global_requests",
                                            "global_sectors",
                                            "mma",
                                            "ldmatrix",
                                            "cp_async"};
        const double *v = (const double *)&k.c;
        for (size_t j = 0; j < sizeof names / sizeof *names; j++)
            fprintf(f, ", \"%s\": %.0f", names[j], v[j]);
        fprintf(f, "}%s\n", ++i < profiles.size() ? "," : "");
    }
    fprintf(f, "]\n");
    fclose(f);
}

static void execute(launch *L) {
    pool_init();
    L->n_blocks = (long)L->grid.x * L->grid.y * L->grid.z;
    L->n_run = profiling && opt_sample > 0 && opt_sample < L->n_blocks ? opt_sample : L->n_blocks;
    int helpers = L->n_blocks > 1 ? (int)pool.size() - 1 : 0;
    if (helpers) {
        std::lock_guard<std::mutex> lk(pool_mu);
        pool_job = L, pool_gen++, pool_busy = helpers;
        pool_cv.notify_all();
    }
    work_on(pool[0], L);
    if (helpers) {
        std::unique_lock<std::mutex> lk(pool_mu);
        done_cv.wait(lk, [] { return pool_busy == 0; });
    }
    kernel_profile *k = NULL;
    if (profiling) {
        static bool registered = atexit(profile_write) == 0;
        (void)registered;
        k = &profiles[L->site.fn];
        k->name = L->site.name;
        k->launches++, k->grid_blocks += L->n_blocks;
        k->threads_per_block = (double)L->block.x * L->block.y * L->block.z,
        k->dyn_smem = (double)L->smem;
    }
    const double scale = (double)L->n_blocks / L->n_run; // sampled blocks stand for the grid
    for (worker *w : pool) {
        double *src = (double *)&w->ctr, *dst = k ? (double *)&k->c : NULL;
        for (size_t i = 0; i < sizeof w->ctr / sizeof(double); i++) {
            if (dst) dst[i] += src[i] * scale;
            src[i] = 0;
        }
    }
    if (L->errors.load()) {
        fprintf(stderr, "simt: %d finding%s in kernel %s (launched at %s:%d)\n", L->errors.load(),
                L->errors.load() > 1 ? "s" : "", L->site.name, L->site.file, L->site.line);
        fail_sticky(cudaErrorLaunchFailure);
    }
}

} // namespace simt

// ---- streams, graphs, launches
// ----------------------------------------------------------------------------

struct simt_graph {
    std::vector<std::function<void()>> nodes;
};
struct simt_graph_exec {
    std::vector<std::function<void()>> nodes;
};
struct simt_stream {
    simt_graph *capturing;
    cudaStreamCaptureMode mode;
    bool invalidated;
};
struct simt_event {
    double t;
};

namespace simt {

static int capturing_global; // streams capturing in a mode that forbids unsafe calls

static cudaError_t set_last(cudaError_t e) {
    if (e != cudaSuccess) last.store((int)e);
    return e;
}
static cudaError_t status() {
    return (cudaError_t)sticky.load();
}

// Calls a capture forbids (cudaMalloc, synchronous copies) while a stream captures in global mode.
static cudaError_t capture_unsafe(const char *what) {
    if (!capturing_global) return cudaSuccess;
    fprintf(stderr,
            "simt: %s while a stream is being captured (cudaStreamCaptureModeGlobal "
            "forbids it; the capture is invalidated)\n",
            what);
    return set_last(cudaErrorStreamCaptureUnsupported);
}

cudaError_t stream_enqueue(cudaStream_t s, std::function<void()> fn) {
    if (status()) return status();
    if (s && s->capturing) {
        s->capturing->nodes.push_back(std::move(fn));
        return cudaSuccess;
    }
    fn();
    return status();
}

} // namespace simt

void simt_launch_run(const simt_launch_site &site, dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, std::function<void()> body);

static std::map<const void *, int> max_dynamic_smem; // cudaFuncAttributeMaxDynamicSharedMemorySize

void simt_launch_run(const simt_launch_site &site, dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, std::function<void()> body) {
    heap_init();
    const char *bad = NULL;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    auto it = max_dynamic_smem.find(site.fn);
    size_t allowed = it != max_dynamic_smem.end() ? (size_t)it->second : 48 << 10;
    char why[200];
    if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
        snprintf(why, sizeof why, "block (%u,%u,%u): 1 to 1024 threads, z <= 64", block.x, block.y,
                 block.z),
            bad = why;
    else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
             grid.z > 65535)
        snprintf(why, sizeof why, "grid (%u,%u,%u): x in [1, 2^31 - 1], y and z in [1, 65535]",
                 grid.x, grid.y, grid.z),
            bad = why;
    else if (smem > allowed)
        snprintf(why, sizeof why, "%zu bytes of dynamic shared memory, over the %zu allowed%s",
                 smem, allowed,
                 smem > DYN_MAX ? " (227 KiB at most)" : " (cudaFuncSetAttribute raises it)"),
            bad = why;
    if (bad) {
        fprintf(stderr, "simt: launch of %s at %s:%d refused: %s\n", site.name, site.file,
                site.line, bad);
        set_last(cudaErrorInvalidConfiguration);
        return;
    }
    auto L = std::make_shared<launch>();
    L->site = site, L->grid = grid, L->block = block, L->smem = smem, L->body = std::move(body);
    cudaError_t e = stream_enqueue(stream, [L] {
        L->next = 0, L->errors = 0;
        execute(L.get());
    });
    set_last(e);
}

cudaError_t simt_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || (size_t)value > DYN_MAX) return set_last(cudaErrorInvalidValue);
    max_dynamic_smem[fn] = value;
    return cudaSuccess;
}

// ---- the runtime API
// ------------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev != 0) return set_last(cudaErrorInvalidValue);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "SIMT emulator on the CPU (an H100's limits)");
    p->totalGlobalMem = DEVICE_TOTAL;
    p->sharedMemPerBlock = 48 << 10, p->sharedMemPerBlockOptin = DYN_MAX;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32, p->maxThreadsPerBlock = 1024, p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = env_int("SIMT_SMS", 132);
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
    return dev == 0 ? status() : set_last(cudaErrorInvalidValue);
}
cudaError_t cudaGetDevice(int *dev) {   // one emulated device
    *dev = 0;
    return status();
}
cudaError_t cudaDeviceSynchronize() {
    return status();
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    heap_init();
    *p = NULL;
    if (status()) return status();
    if (cudaError_t e = capture_unsafe("cudaMalloc")) return e;
    std::lock_guard<std::mutex> g(heap_mu);
    const size_t gran = (size_t)1 << GRAN, n = bytes ? bytes : 1,
                 span = (n + gran - 1) / gran * gran;
    if (heap_used + n > DEVICE_TOTAL ||
        heap_used + n + ((size_t)1 << 30) > heap_used + host_available() ||
        heap_cursor + span + gran > heap_lo + HEAP_SPAN)
        return set_last(cudaErrorMemoryAllocation);
    uintptr_t base = heap_cursor;
    if (mprotect((void *)base, span, PROT_READ | PROT_WRITE))
        return set_last(cudaErrorMemoryAllocation);
    heap_cursor += span + gran; // and a guard granule, never mapped
    allocation al = {(uint32_t)allocs.size(), base, n, false, __builtin_return_address(0)};
    allocs.push_back(al);
    for (size_t i = 0; i < span / gran; i++)
        gran_table[((base - heap_lo) >> GRAN) + i] = al.id;
    memset((void *)base, 0xff, n); // what cudaMalloc hands out: not zeros (NaN as bf16 and fp32)
    heap_used += n;
    *p = (void *)base;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return status();
    if (cudaError_t e = capture_unsafe("cudaFree")) return e;
    std::lock_guard<std::mutex> g(heap_mu);
    const allocation *al = alloc_of((uintptr_t)p);
    if (!al || al->freed || al->base != (uintptr_t)p) {
        fprintf(stderr, "simt: cudaFree(%p): %s\n", p,
                !al         ? "not a device allocation"
                : al->freed ? "freed already"
                            : "not the start of an allocation");
        return set_last(cudaErrorInvalidDevicePointer);
    }
    allocation &a = allocs[al->id];
    a.freed = true;
    heap_used -= a.bytes;
    size_t span = (a.bytes + ((size_t)1 << GRAN) - 1) >> GRAN << GRAN;
    madvise((void *)a.base, span, MADV_DONTNEED);
    mprotect((void *)a.base, span, PROT_NONE);
    return status();
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    size_t host = host_available(), slack = (size_t)1 << 30;
    size_t dev = DEVICE_TOTAL - heap_used, h = host > slack ? host - slack : 0;
    *free_bytes = dev < h ? dev : h;
    *total_bytes = DEVICE_TOTAL;
    return status();
}

// Both ends of a copy checked against where its kind says they are.
static cudaError_t copy_check(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    bool dd = in_heap((uintptr_t)dst), sd = in_heap((uintptr_t)src);
    if (kind == cudaMemcpyDefault) kind = (cudaMemcpyKind)(sd * 2 + dd);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (dd != want_dd || sd != want_sd) {
        fprintf(stderr, "simt: cudaMemcpy kind %d with %s destination and %s source\n", (int)kind,
                dd ? "a device" : "a host", sd ? "a device" : "a host");
        return set_last(cudaErrorInvalidValue);
    }
    if ((dd && device_range(dst, n, "cudaMemcpy destination")) ||
        (sd && device_range(src, n, "cudaMemcpy source")))
        return set_last(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    if (cudaError_t e = capture_unsafe("cudaMemcpy")) return e;
    if (status()) return status();
    if (cudaError_t e = copy_check(dst, src, n, kind)) return e;
    memcpy(dst, src, n);
    return status();
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
    if (cudaError_t e = copy_check(dst, src, n, kind)) return e;
    return set_last(stream_enqueue(s, [=] { memcpy(dst, src, n); }));
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s) {
    if (width > dpitch || width > spitch) return set_last(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++)
        if (cudaError_t e =
                copy_check((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind))
            return e;
    return set_last(stream_enqueue(s, [=] {
        for (size_t r = 0; r < height; r++)
            memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    }));
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    if (device_range(p, n, "cudaMemset")) return set_last(cudaErrorInvalidValue);
    return set_last(stream_enqueue(s, [=] { memset(p, value, n); }));
}

cudaError_t cudaMemset(void *p, int value, size_t n) {
    if (cudaError_t e = capture_unsafe("cudaMemset")) return e;
    return cudaMemsetAsync(p, value, n, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, 0);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = new simt_stream();
    return status();
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s && s->capturing) return set_last(cudaErrorStreamCaptureUnsupported);
    delete s;
    return status();
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if ((s && s->capturing) || capturing_global) { // waiting on work that is being recorded
        if (s && s->capturing) s->invalidated = true;
        fprintf(
            stderr,
            "simt: cudaStreamSynchronize during a stream capture (the capture is invalidated)\n");
        return set_last(cudaErrorStreamCaptureUnsupported);
    }
    return status();
}

static double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new simt_event{0};
    return status();
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    return set_last(stream_enqueue(s, [e] { e->t = now_ms(); }));
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
    return status();
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(b->t - a->t);
    return status();
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return status();
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    if (!s) {
        fprintf(stderr, "simt: the legacy default stream cannot be captured\n");
        return set_last(cudaErrorStreamCaptureUnsupported);
    }
    if (s->capturing) return set_last(cudaErrorInvalidValue);
    s->capturing = new simt_graph(), s->mode = mode, s->invalidated = false;
    if (mode != cudaStreamCaptureModeRelaxed) capturing_global++;
    return status();
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    if (!s || !s->capturing) return set_last(cudaErrorInvalidValue);
    if (s->mode != cudaStreamCaptureModeRelaxed) capturing_global--;
    *g = s->capturing, s->capturing = NULL;
    if (s->invalidated) {
        delete *g;
        *g = NULL;
        return set_last(cudaErrorStreamCaptureInvalidated);
    }
    return status();
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    if (!g) return set_last(cudaErrorInvalidValue);
    *e = new simt_graph_exec{g->nodes};
    return status();
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    if (!e) return set_last(cudaErrorInvalidValue);
    for (auto &n : e->nodes)
        if (cudaError_t r = stream_enqueue(s, n)) return set_last(r);
    return status();
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return status();
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return status();
}

cudaError_t cudaGetLastError() {
    if (status()) return status();
    return (cudaError_t)last.exchange(0);
}
cudaError_t cudaPeekAtLastError() {
    return status() ? status() : (cudaError_t)last.load();
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
        return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
        return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress:
        return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
        return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
        return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported:
        return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
        return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread:
        return "cudaErrorStreamCaptureWrongThread";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorLaunchFailure:
        return "the emulator found an error in a kernel (see the simt: report above)";
    case cudaErrorInvalidConfiguration:
        return "invalid launch configuration (see the simt: line above)";
    case cudaErrorMemoryAllocation:
        return "out of (emulated) device memory";
    default:
        return "see the simt: report above";
    }
}
