/* packcache.c - the packed-weight cache: pack files named by the weights' content, verified by a
 * checksum, mapped without a copy, written atomically, evicted least recently used first.
 * Called on a decoder's owner thread; the pool only helps hash. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "runtime/packcache.h"

/* ---- the hash ------------------------------------------------------------------------------ */

#define H_P1 0x9E3779B185EBCA87ull
#define H_P2 0xC2B2AE3D27D4EB4Full
#define H_P3 0x165667B19E3779F9ull
#define H_P4 0x85EBCA77C2B2AE63ull
#define H_P5 0x27D4EB2F165667C5ull

static inline uint64_t rotl64(uint64_t x, int r)
{
    return x << r | x >> (64 - r);
}

/* One multiply a word: xor, odd multiply and rotate are each a bijection of the lane, so a
 * single changed word always changes its lane. */
static inline uint64_t lane(uint64_t acc, uint64_t w)
{
    return rotl64((acc ^ w) * H_P1, 29);
}

static inline uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

uint64_t kwk_hash64(const void *data, size_t n, uint64_t seed)
{
    const uint8_t *p = data, *end = p + n;
    uint64_t h = seed + H_P5;
    if (n >= 32) {
        uint64_t a = seed + H_P1, b = seed + H_P2, c = seed + H_P3, d = seed + H_P4;
        for (; end - p >= 32; p += 32) {
            a = lane(a, rd64(p));
            b = lane(b, rd64(p + 8));
            c = lane(c, rd64(p + 16));
            d = lane(d, rd64(p + 24));
        }
        h = rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) + rotl64(d, 18);
        const uint64_t ls[4] = {a, b, c, d};
        for (int i = 0; i < 4; i++)
            h = (h ^ ls[i] * H_P2) * H_P1 + H_P4;
    }
    h += (uint64_t)n;
    for (; end - p >= 8; p += 8)
        h = rotl64(h ^ rd64(p) * H_P2, 27) * H_P1 + H_P4;
    for (; p < end; p++)
        h = rotl64(h ^ *p * H_P5, 11) * H_P1;
    h ^= h >> 33;
    h *= H_P2;
    h ^= h >> 29;
    h *= H_P3;
    h ^= h >> 32;
    return h;
}

/* Regions are hashed in chunks of 1 MiB on the pool and the chunk hashes hashed in order: the
 * result does not depend on the number of threads. */
#define CHUNK ((size_t)1 << 20)

struct region {
    const uint8_t *p;
    size_t n;
};

struct hash_task {
    struct region *chunks; /* [n_chunks] */
    uint64_t *out;         /* [n_chunks] */
    long n_chunks;
    int drop;              /* the regions are read-only file mappings: drop pages once hashed */
    _Atomic long next;     /* relaxed: chunks are independent */
};

/* The whole pages inside a hashed chunk of a checkpoint file leave this process's resident
 * memory: a cached pack is what will run, and keeping the checkpoint resident beside it would
 * double the peak memory of a balanced / int4 process. They fault back in if read again. */
static void drop_pages(const uint8_t *p, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void hash_run(void *ctx, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct hash_task *t = ctx;
    for (;;) {
        long i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (i >= t->n_chunks)
            break;
        t->out[i] = kwk_hash64(t->chunks[i].p, t->chunks[i].n, (uint64_t)i);
        if (t->drop)
            drop_pages(t->chunks[i].p, t->chunks[i].n);
    }
}

/* Hash r[n_r] as one key; -1 when out of memory. */
static int hash_regions(const struct region *r, int n_r, int drop, struct kwk_pool *pool,
                        uint64_t *out)
{
    long n_chunks = 0;
    for (int i = 0; i < n_r; i++)
        n_chunks += (long)((r[i].n + CHUNK - 1) / CHUNK);
    struct hash_task t = {0};
    t.chunks = kwk_calloc((size_t)n_chunks + 1, sizeof *t.chunks);
    t.out = kwk_calloc((size_t)n_chunks + 1, sizeof *t.out);
    if (!t.chunks || !t.out) {
        kwk_free(t.chunks);
        kwk_free(t.out);
        return -1;
    }
    for (int i = 0; i < n_r; i++)
        for (size_t off = 0; off < r[i].n; off += CHUNK)
            t.chunks[t.n_chunks++] = (struct region){r[i].p + off, KWK_MIN(CHUNK, r[i].n - off)};
    t.drop = drop;
    atomic_init(&t.next, 0);
    if (pool && t.n_chunks > 1)
        kwk_pool_run(pool, hash_run, &t);
    else
        hash_run(&t, 0, 1);
    *out = kwk_hash64(t.out, (size_t)t.n_chunks * sizeof *t.out, (uint64_t)n_r);
    kwk_free(t.chunks);
    kwk_free(t.out);
    return 0;
}

/* ---- the file format ----------------------------------------------------------------------- */

/* A pack file: this header, then n_mats records, then each matrix's blocks at a page-aligned
 * offset. Native byte order. magic and version stay at offsets 0 and 8 in every version, so any
 * build can tell a file of another version and replace it. */
struct pack_head {
    char magic[8];          /* "KWKPACK" */
    uint32_t version;       /* KWK_PACK_FORMAT_VERSION */
    uint32_t n_mats;
    uint64_t file_size;
    uint64_t checksum;      /* hash of the whole file with this field read as zero */
    uint64_t content;       /* hash of the sources' bytes */
    uint64_t config;        /* hash of the records and the salt */
    uint64_t reserved[2];
};
_Static_assert(sizeof(struct pack_head) == 64, "pack head is 64 bytes");

struct pack_rec {
    int32_t src_wtype, wtype;
    int64_t rows, cols;
    uint64_t offset, bytes; /* of the blocks, in the file */
};
_Static_assert(sizeof(struct pack_rec) == 40, "pack record is 40 bytes");

static const char pack_magic[8] = "KWKPACK";
#define PACK_ALIGN 4096

struct kwk_packcache {
    char path[4096];  /* the pack file */
    char tmp[4096];   /* the file being written (MISS), else "" */
    char dir[4096];
    int fd;           /* open while writing, else -1 */
    uint8_t *base;    /* the mapping */
    size_t size;
    int64_t max_bytes;
    dev_t dev;        /* the mapped file's identity (HIT) */
    ino_t ino;
    char key[4096];   /* the source key that found the pack (HIT without hashing), else "" */
};

static size_t src_elem_size(int wtype)
{
    switch (wtype) {
    case KWK_W_F32: return 4;
    case KWK_W_F16:
    case KWK_W_BF16: return 2;
    default: return 0;
    }
}

/* The records of e[n] and the file's size; -1 when a source cannot be cached or sizes
 * overflow. */
static int layout(const struct kwk_pack_entry *e, int n, struct pack_rec *recs, size_t *size)
{
    size_t off = sizeof(struct pack_head) + (size_t)n * sizeof(struct pack_rec);
    for (int i = 0; i < n; i++) {
        if (!src_elem_size(e[i].src->wtype))
            return -1;
        off = (off + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
        recs[i] = (struct pack_rec){e[i].src->wtype, e[i].dst->wtype, e[i].dst->rows,
                                    e[i].dst->cols, off, e[i].bytes};
        if (kwk_add_size(off, e[i].bytes, &off) || off > (size_t)INT64_MAX - PACK_ALIGN)
            return -1;
    }
    *size = off;
    return 0;
}

static int content_hash(const struct kwk_packcache_opts *o, const struct kwk_pack_entry *e,
                        int n, struct kwk_pool *pool, uint64_t *out)
{
    if (o->sources) {
        struct region *r = kwk_calloc((size_t)o->n_sources + 1, sizeof *r);
        if (!r)
            return -1;
        for (int i = 0; i < o->n_sources; i++)
            r[i] = (struct region){o->sources[i].data, o->sources[i].n};
        int rc = hash_regions(r, o->n_sources, o->drop_sources, pool, out);
        kwk_free(r);
        return rc;
    }
    struct region *r = kwk_calloc((size_t)n, sizeof *r);
    if (!r)
        return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        size_t cells, bytes = 0;
        const struct kwk_mat *s = e[i].src;
        if (kwk_mul_size((size_t)s->rows, (size_t)s->cols, &cells) ||
            kwk_mul_size(cells, src_elem_size(s->wtype), &bytes))
            rc = -1;
        r[i] = (struct region){s->data, bytes};
    }
    if (!rc)
        rc = hash_regions(r, n, 0, pool, out);
    kwk_free(r);
    return rc;
}

/* The checksum of a whole file image: everything but the checksum field. */
static int file_checksum(const uint8_t *base, size_t size, struct kwk_pool *pool, uint64_t *out)
{
    size_t at = offsetof(struct pack_head, checksum);
    struct region r[2] = {{base, at}, {base + at + 8, size - at - 8}};
    return hash_regions(r, 2, 0, pool, out);
}

/* ---- files --------------------------------------------------------------------------------- */

static int mkdir_p(const char *dir)
{
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf)
        return -ENAMETOOLONG;
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -errno;
        buf[i] = c;
    }
    return kwk_dir_exists(dir) ? 0 : -ENOTDIR;
}

/* Remove path if it is still the file open as fd: another process may have just renamed a good
 * pack over the bad one. */
static void remove_bad(const char *path, int fd)
{
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
        unlink(path);
}

static int64_t max_bytes_of(int64_t param)
{
    if (param > 0)
        return param;
    const char *env = getenv("KWKER_CACHE_MAX");
    if (!env || !*env)
        return KWK_PACK_CACHE_MAX_DEFAULT;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    int shift = 0;
    if (*end == 'k' || *end == 'K')
        shift = 10;
    else if (*end == 'm' || *end == 'M')
        shift = 20;
    else if (*end == 'g' || *end == 'G')
        shift = 30;
    if (shift)
        end++;
    if (end == env || *end || errno || env[0] == '-' ||
        v > (unsigned long long)INT64_MAX >> shift) {
        kwk_log(KWK_LOG_WARN, "KWKER_CACHE_MAX=%s is not a byte count; using %lld", env,
                (long long)KWK_PACK_CACHE_MAX_DEFAULT);
        return KWK_PACK_CACHE_MAX_DEFAULT;
    }
    return (int64_t)(v << shift);
}

/* Map an existing pack and check it against recs: 1 = valid (c->base, c->size set), 0 = none,
 * -1 = invalid (logged and removed). */
static int map_existing(struct kwk_packcache *c, const struct pack_head *want,
                        const struct pack_rec *recs, struct kwk_pool *pool)
{
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT)
            kwk_log(KWK_LOG_WARN, "pack cache: %s: %s", c->path, strerror(errno));
        return 0;
    }
    const char *why = NULL;
    int level = KWK_LOG_WARN;
    struct pack_head h;
    struct stat st;
    void *p = MAP_FAILED;
    size_t rec_bytes = (size_t)want->n_mats * sizeof(struct pack_rec);
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof h ||
        pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        why = "truncated (shorter than its header)";
        goto out_bad;
    }
    if (memcmp(h.magic, pack_magic, sizeof h.magic)) {
        why = "not a pack file";
        goto out_bad;
    }
    if (h.version != want->version) {
        why = "another pack format version";
        level = KWK_LOG_INFO;
        goto out_bad;
    }
    if (h.file_size != (uint64_t)st.st_size) {
        why = "truncated or extended (size differs from its header)";
        goto out_bad;
    }
    if (h.n_mats != want->n_mats || h.content != want->content || h.config != want->config ||
        h.file_size != want->file_size) {
        why = "its key does not match its name";
        goto out_bad;
    }
    p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: mmap: %s", c->path, strerror(errno));
        close(fd);
        return 0;
    }
    /* Huge pages where the file system offers them (issue 6), read in all at once (the
     * checksum touches every page anyway); a pack something else read into the page cache (a
     * copy, a backup) is read again to get them */
    kwk_map_huge(&(struct kwk_map){.data = p, .size = (size_t)st.st_size}, c->path);
    uint64_t sum;
    if (memcmp((const uint8_t *)p + sizeof h, recs, rec_bytes)) {
        why = "its matrix table does not match";
        goto out_bad;
    }
    if (file_checksum(p, (size_t)st.st_size, pool, &sum)) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: out of memory to verify it", c->path);
        munmap(p, (size_t)st.st_size);
        close(fd);
        return 0;
    }
    if (sum != h.checksum) {
        why = "corrupt (checksum mismatch)";
        goto out_bad;
    }
    /* LRU by mtime: a use counts as a touch (atime is often off or relaxed). */
    if (futimens(fd, NULL) != 0)
        kwk_log(KWK_LOG_DEBUG, "pack cache: %s: cannot update its time: %s", c->path,
                strerror(errno));
    close(fd);
    c->base = p;
    c->size = (size_t)st.st_size;
    c->dev = st.st_dev;
    c->ino = st.st_ino;
    return 1;
out_bad:
    kwk_log(level, "pack cache: %s: %s; removing it and packing again", c->path, why);
    if (p != MAP_FAILED)
        munmap(p, (size_t)st.st_size);
    remove_bad(c->path, fd);
    close(fd);
    return -1;
}

/* Create the temporary file of a new pack, sized and mapped writable. */
static int create_tmp(struct kwk_packcache *c, const char *name, const struct pack_head *h,
                      const struct pack_rec *recs)
{
    static _Atomic unsigned serial;
    unsigned s = atomic_fetch_add_explicit(&serial, 1, memory_order_relaxed);
    int n = snprintf(c->tmp, sizeof c->tmp, "%s/.%s.tmp.%ld.%u", c->dir, name, (long)getpid(),
                     s);
    if (n < 0 || (size_t)n >= sizeof c->tmp) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: path too long", c->dir);
        return -1;
    }
    c->fd = open(c->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (c->fd < 0) {
        kwk_log(KWK_LOG_WARN, "pack cache: cannot create %s: %s; packing without the cache",
                c->tmp, strerror(errno));
        c->tmp[0] = '\0';
        return -1;
    }
    /* Reserve the blocks now: writing through a mapping into a full disk would be a SIGBUS. */
    int rc = posix_fallocate(c->fd, 0, (off_t)h->file_size);
    if (rc) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: cannot reserve %.1f MB: %s; packing without the "
                "cache", c->tmp, (double)h->file_size / 1e6, strerror(rc));
        return -1;
    }
    void *p = mmap(NULL, (size_t)h->file_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (p == MAP_FAILED) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: mmap: %s; packing without the cache", c->tmp,
                strerror(errno));
        return -1;
    }
    madvise(p, (size_t)h->file_size, MADV_HUGEPAGE);
    c->base = p;
    c->size = (size_t)h->file_size;
    memcpy(c->base, h, sizeof *h);
    memcpy(c->base + sizeof *h, recs, (size_t)h->n_mats * sizeof *recs);
    return 0;
}

/* The pack named by h's keys into c->path and name[256]; map_existing's result, or -1 when the
 * path is too long. */
static int map_named(struct kwk_packcache *c, const struct kwk_packcache_opts *o,
                     const struct pack_head *h, const struct pack_rec *recs, struct kwk_pool *pool,
                     char *name)
{
    snprintf(name, 256, "%016" PRIx64 "-%s-%016" PRIx64 ".kwkpack", h->content,
             o->label ? o->label : "pack", h->config);
    if (kwk_path_join(c->path, sizeof c->path, o->dir, name)) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: path too long", o->dir);
        return -1;
    }
    return map_existing(c, h, recs, pool) == 1;
}

/* ---- source keys -------------------------------------------------------------------------
 * Hashing the sources reads the whole checkpoint (3.4 GB for SmolLM2-1.7B in bf16; from disk on a
 * cold start) to find a pack a fraction of its size. A source key file, <source_id>.kwksrc,
 * remembers the content hash found for a source id (kwk_packcache_opts.source_id: the files' ids
 * and the sources' places in them), so a later load of the same, unchanged files maps its pack
 * without reading them. A key file that is short, foreign or torn is ignored (and rewritten);
 * losing one costs one hash. */
struct source_key {
    char magic[8]; /* "KWKSRC1" */
    uint64_t source_id;
    uint64_t content;
    uint64_t check; /* kwk_hash64 of the fields above */
};
_Static_assert(sizeof(struct source_key) == 32, "source key is 32 bytes");

static const char key_magic[8] = "KWKSRC1";
#define KEYS_MAX 1024 /* key files kept by evict, least recently used removed first */

static uint64_t key_check(const struct source_key *k)
{
    return kwk_hash64(k, offsetof(struct source_key, check), H_P2);
}

/* The content hash the key file at path holds for source_id: 1 (and *content), else 0. Touches
 * the file's mtime (its use, for evict). */
static int read_source_key(const char *path, uint64_t source_id, uint64_t *content)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct source_key k;
    int ok = pread(fd, &k, sizeof k, 0) == (ssize_t)sizeof k &&
             !memcmp(k.magic, key_magic, sizeof k.magic) && k.source_id == source_id &&
             k.check == key_check(&k);
    if (ok) {
        *content = k.content;
        futimens(fd, NULL);
    }
    close(fd);
    return ok;
}

/* Write path (in dir) through a temporary and a rename, so no reader sees half a key. Best
 * effort: a key not written costs the next load a hash. */
static void write_source_key(const char *dir, const char *path, uint64_t source_id,
                             uint64_t content)
{
    static _Atomic unsigned serial;
    struct source_key k = {.source_id = source_id, .content = content};
    memcpy(k.magic, key_magic, sizeof k.magic);
    k.check = key_check(&k);
    char tmp[4096];
    unsigned sn = atomic_fetch_add_explicit(&serial, 1, memory_order_relaxed);
    int n = snprintf(tmp, sizeof tmp, "%s/.%016" PRIx64 ".kwksrc.tmp.%ld.%u", dir, source_id,
                     (long)getpid(), sn);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        kwk_log(KWK_LOG_DEBUG, "pack cache: cannot create %s: %s", tmp, strerror(errno));
        return;
    }
    int ok = write(fd, &k, sizeof k) == (ssize_t)sizeof k;
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        kwk_log(KWK_LOG_DEBUG, "pack cache: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
}

/* KWKER_CACHE_REHASH=1: hash the sources at every load, as if no source key were kept. */
static int rehash_always(void)
{
    return kwk_env_word("KWKER_CACHE_REHASH", (const char *const[]){"0", "1"}, 2) == 1;
}

int kwk_packcache_open(const struct kwk_packcache_opts *o, struct kwk_pack_entry *e, int n,
                       struct kwk_pool *pool, struct kwk_packcache **out)
{
    *out = NULL;
    if (!o || !o->dir || !o->dir[0] || n <= 0)
        return KWK_PACKCACHE_OFF;
    double t0 = kwk_time_s();
    int status = KWK_PACKCACHE_OFF;
    struct pack_rec *recs = kwk_calloc((size_t)n, sizeof *recs);
    struct kwk_packcache *c = kwk_calloc(1, sizeof *c);
    if (!recs || !c)
        goto out;
    c->fd = -1;
    struct pack_head h = {.version = KWK_PACK_FORMAT_VERSION, .n_mats = (uint32_t)n};
    memcpy(h.magic, pack_magic, sizeof h.magic);
    size_t size;
    if (layout(e, n, recs, &size)) {
        kwk_log(KWK_LOG_INFO, "pack cache: these weights cannot be cached; packing in memory");
        goto out;
    }
    h.file_size = size;
    h.config = kwk_hash64(recs, (size_t)n * sizeof *recs, o->salt ^ H_P3);
    int rc = mkdir_p(o->dir);
    if (rc) {
        kwk_log(KWK_LOG_WARN, "pack cache: cannot use directory %s: %s; packing without the "
                "cache", o->dir, strerror(-rc));
        goto out;
    }
    snprintf(c->dir, sizeof c->dir, "%s", o->dir);
    c->max_bytes = max_bytes_of(o->max_bytes);
    /* A source key names the pack without reading the sources; a pack not found under it is
     * looked for (and made) under the sources' hash, so every pack is named by its bytes. */
    char key[4096] = "", name[256];
    if (o->sources && o->source_id) {
        snprintf(name, sizeof name, "%016" PRIx64 ".kwksrc", o->source_id);
        if (kwk_path_join(key, sizeof key, o->dir, name))
            key[0] = '\0';
    }
    int keyed = key[0] && !rehash_always() && read_source_key(key, o->source_id, &h.content);
    if ((rc = keyed ? map_named(c, o, &h, recs, pool, name) : 0) < 0)
        goto out;
    double t_hash = -1;
    if (rc == 1) {
        snprintf(c->key, sizeof c->key, "%s", key);
    } else {
        double t1 = kwk_time_s();
        if (content_hash(o, e, n, pool, &h.content))
            goto out;
        t_hash = kwk_time_s() - t1;
        if (key[0])
            write_source_key(o->dir, key, o->source_id, h.content);
        if ((rc = map_named(c, o, &h, recs, pool, name)) < 0)
            goto out;
    }
    if (rc == 1) {
        status = KWK_PACKCACHE_HIT;
        if (t_hash < 0)
            kwk_log(KWK_LOG_INFO, "pack cache: mapped %s (%.1f MB) in %.3f s (the weights' files "
                    "are unchanged since they were hashed: not read)", c->path,
                    (double)c->size / 1e6, kwk_time_s() - t0);
        else
            kwk_log(KWK_LOG_INFO, "pack cache: mapped %s (%.1f MB) in %.3f s (hashing the "
                    "weights %.3f s)", c->path, (double)c->size / 1e6, kwk_time_s() - t0, t_hash);
    } else if (create_tmp(c, name, &h, recs) == 0) {
        status = KWK_PACKCACHE_MISS;
    } else {
        goto out;
    }
    for (int i = 0; i < n; i++)
        e[i].dst->data = c->base + recs[i].offset;
    *out = c;
    c = NULL;
out:
    kwk_free(recs);
    kwk_packcache_free(c);
    return status;
}

/* Pack files, source keys and stale temporaries of dir over max bytes go, oldest mtime first, and
 * source keys past KEYS_MAX; keep is never removed (the pack just written). */
struct dir_ent {
    char name[256];
    int64_t size;
    struct timespec mtime;
    int kind; /* file_kind */
};

static int ent_cmp(const void *a, const void *b)
{
    const struct dir_ent *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

enum { F_OTHER, F_PACK, F_KEY, F_TMP };

static int file_kind(const char *name, time_t mtime)
{
    size_t n = strlen(name);
    if (name[0] != '.' && n > 8 && !strcmp(name + n - 8, ".kwkpack"))
        return F_PACK;
    if (name[0] != '.' && n > 7 && !strcmp(name + n - 7, ".kwksrc"))
        return F_KEY;
    /* a temporary left by a process that died while writing it: a day old is surely dead */
    if (name[0] == '.' && (strstr(name, ".kwkpack.tmp.") || strstr(name, ".kwksrc.tmp.")) &&
        time(NULL) - mtime > 86400)
        return F_TMP;
    return F_OTHER;
}

static void evict(const char *dir, int64_t max, const char *keep)
{
    DIR *d = opendir(dir);
    if (!d) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: %s", dir, strerror(errno));
        return;
    }
    struct dir_ent *ents = NULL;
    size_t n = 0, cap = 0;
    int64_t total = 0;
    long keys = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (strlen(de->d_name) >= sizeof ents->name ||
            fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        int kind = file_kind(de->d_name, st.st_mtim.tv_sec);
        if (kind == F_OTHER)
            continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 64;
            struct dir_ent *g = kwk_realloc(ents, ncap * sizeof *g);
            if (!g)
                break;
            ents = g;
            cap = ncap;
        }
        snprintf(ents[n].name, sizeof ents[n].name, "%s", de->d_name);
        ents[n].size = (int64_t)st.st_size;
        ents[n].mtime = st.st_mtim;
        ents[n].kind = kind;
        total += ents[n].size;
        keys += kind == F_KEY;
        n++;
    }
    if ((total > max || keys > KEYS_MAX) && n > 0)
        qsort(ents, n, sizeof *ents, ent_cmp);
    for (size_t i = 0; i < n && (total > max || keys > KEYS_MAX); i++) {
        char path[4096];
        if ((total <= max && ents[i].kind != F_KEY) ||
            kwk_path_join(path, sizeof path, dir, ents[i].name) || !strcmp(path, keep))
            continue;
        if (unlinkat(dirfd(d), ents[i].name, 0) == 0) {
            total -= ents[i].size;
            keys -= ents[i].kind == F_KEY;
            if (ents[i].kind != F_KEY)
                kwk_log(KWK_LOG_INFO, "pack cache: removed %s (%.1f MB, least recently used; "
                        "the limit is %.1f MB)", path, (double)ents[i].size / 1e6,
                        (double)max / 1e6);
        }
    }
    if (total > max)
        kwk_log(KWK_LOG_WARN, "pack cache: %s holds %.1f MB, over its limit of %.1f MB", dir,
                (double)total / 1e6, (double)max / 1e6);
    kwk_free(ents);
    closedir(d);
}

void kwk_packcache_commit(struct kwk_packcache *c, struct kwk_pool *pool)
{
    if (!c || c->fd < 0)
        return;
    double t0 = kwk_time_s();
    struct pack_head *h = (struct pack_head *)c->base;
    const char *what = NULL;
    int e = 0;
    uint64_t sum;
    if (file_checksum(c->base, c->size, pool, &sum)) {
        what = "checksum";
        e = ENOMEM;
        goto out;
    }
    h->checksum = sum;
    if (msync(c->base, c->size, MS_SYNC) != 0 || fsync(c->fd) != 0) {
        what = "write";
        e = errno;
        goto out;
    }
    if (rename(c->tmp, c->path) != 0) {
        what = "rename";
        e = errno;
        goto out;
    }
    c->tmp[0] = '\0';
    /* The rename itself must reach the disk before we rely on the file being there. */
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    kwk_log(KWK_LOG_INFO, "pack cache: wrote %s (%.1f MB) in %.2f s", c->path,
            (double)c->size / 1e6, kwk_time_s() - t0);
out:
    if (what)
        kwk_log(KWK_LOG_WARN, "pack cache: %s: %s failed: %s; the packed weights stay in memory",
                c->tmp, what, strerror(e));
    if (c->tmp[0])
        unlink(c->tmp); /* the mapping outlives the name */
    c->tmp[0] = '\0';
    mprotect(c->base, c->size, PROT_READ);
    close(c->fd);
    c->fd = -1;
    if (!what)
        evict(c->dir, c->max_bytes, c->path);
}

void kwk_packcache_discard(struct kwk_packcache *c)
{
    struct stat st;
    if (c && c->ino && stat(c->path, &st) == 0 && st.st_ino == c->ino && st.st_dev == c->dev)
        unlink(c->path);
    if (c && c->key[0]) /* so that the next open hashes the sources */
        unlink(c->key);
    kwk_packcache_free(c);
}

void kwk_packcache_free(struct kwk_packcache *c)
{
    if (!c)
        return;
    if (c->base)
        munmap(c->base, c->size);
    if (c->fd >= 0)
        close(c->fd);
    if (c->tmp[0])
        unlink(c->tmp);
    kwk_free(c);
}

const char *kwk_packcache_path(const struct kwk_packcache *c)
{
    return c->path;
}

/* ---- progress bar -------------------------------------------------------------------------- */

void kwk_progress_init(struct kwk_progress *pr, const char *what)
{
    const char *lvl = getenv("KWKER_LOG");
    pr->t0 = kwk_time_s();
    pr->tty = isatty(2) && !(lvl && !strcmp(lvl, "error"));
    pr->shown = 0;
    pr->what = what;
}

void kwk_progress_update(struct kwk_progress *pr, long done, long total)
{
    double t = kwk_time_s() - pr->t0;
    if (!pr->tty || total <= 0 || (!pr->shown && t < 0.3))
        return;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int fill = (int)((double)WIDTH * (double)done / (double)total);
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\rkwker: %s [%s] %3d%% %.1f s", pr->what, bar,
            (int)(100.0 * (double)done / (double)total), t);
    fflush(stderr);
    pr->shown = 1;
}

void kwk_progress_end(struct kwk_progress *pr)
{
    if (pr->shown)
        fputc('\n', stderr);
    pr->shown = 0;
}
