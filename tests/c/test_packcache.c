/* test_packcache.c - the packed-weight cache on in-memory models: a cached pack equals a fresh
 * one byte for byte; changed weights, corrupt, truncated, old-format and stale files are packed
 * again; LRU eviction; an unusable directory; two processes packing at once; source keys (a pack
 * found without reading the sources) and the file ids behind them. Main thread. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/pool.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "runtime/packcache.h"
#include "runtime/packed.h"
#include "test.h"

#define N_LAYERS 2
#define D_MODEL 72 /* not a multiple of the 32-column group */
#define D_FF 100
#define N_VOCAB 50

struct tmodel {
    struct kwk_model m;
    struct kwk_layer layers[N_LAYERS];
    float *bufs[7 * N_LAYERS + 1];
};

static uint64_t rng_state;
static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) - 0.5f;
}

static struct kwk_mat make_mat(struct tmodel *t, int i, int64_t rows, int64_t cols)
{
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t k = 0; k < rows * cols; k++)
        w[k] = rnd();
    t->bufs[i] = w;
    return (struct kwk_mat){.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = w};
}

static void model_init(struct tmodel *t, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    rng_state = seed;
    t->m.cfg.n_layers = N_LAYERS;
    t->m.layers = t->layers;
    int i = 0;
    for (int L = 0; L < N_LAYERS; L++) {
        struct kwk_layer *l = &t->layers[L];
        l->wq = make_mat(t, i++, D_MODEL, D_MODEL);
        l->wk = make_mat(t, i++, 24, D_MODEL);
        l->wv = make_mat(t, i++, 24, D_MODEL);
        l->wo = make_mat(t, i++, D_MODEL, D_MODEL);
        l->w_gate = make_mat(t, i++, D_FF, D_MODEL);
        l->w_up = make_mat(t, i++, D_FF, D_MODEL);
        l->w_down = make_mat(t, i++, D_MODEL, D_FF);
    }
    t->m.lm_head = make_mat(t, i++, N_VOCAB, D_MODEL);
}

static void model_free(struct tmodel *t)
{
    for (size_t i = 0; i < KWK_ARRAY_LEN(t->bufs); i++)
        free(t->bufs[i]);
}

static struct kwk_pool *pool;

static struct kwk_packed *pack(const struct tmodel *t, int prec, const char *dir, int64_t max)
{
    struct kwk_packcache_opts o = {.dir = dir, .max_bytes = max};
    struct kwk_err err = {0};
    struct kwk_packed *p = kwk_packed_new(&t->m, prec, NULL, dir ? &o : NULL, pool, &err);
    T_CHECK(p != NULL, "kwk_packed_new: %s", err.msg);
    return p;
}

#define N_MATS (7 * N_LAYERS + 1)

/* Every packed matrix of p: each layer's seven, then the lm_head. */
static void mats_of(const struct kwk_packed *p, const struct kwk_mat *m[N_MATS])
{
    int n = 0;
    for (int L = 0; L < N_LAYERS; L++) {
        const struct kwk_layer *l = &kwk_packed_layers(p)[L];
        const struct kwk_mat *x[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                     &l->w_down};
        for (int w = 0; w < 7; w++)
            m[n++] = x[w];
    }
    m[n] = kwk_packed_lm_head(p);
}

/* Every packed matrix of a and b: same type, shape and bytes. */
static int same_blocks(const struct kwk_packed *a, const struct kwk_packed *b)
{
    const struct kwk_mat *ma[N_MATS], *mb[N_MATS];
    mats_of(a, ma);
    mats_of(b, mb);
    for (int i = 0; i < N_MATS; i++) {
        size_t bytes;
        if (ma[i]->wtype != mb[i]->wtype || ma[i]->rows != mb[i]->rows ||
            ma[i]->cols != mb[i]->cols || ma[i]->data == mb[i]->data ||
            kwk_quant_bytes(ma[i]->wtype, ma[i]->rows, ma[i]->cols, &bytes) ||
            memcmp(ma[i]->data, mb[i]->data, bytes))
            return 0;
    }
    return 1;
}

/* Whether every packed matrix of p asks its decode prefetches where the CPU's default puts
 * them: a tiny model's bytes are far below any last-level cache (kwk_cpu_prefetch_l2_for). */
static int prefetch_default(const struct kwk_packed *p)
{
    const struct kwk_mat *m[N_MATS];
    mats_of(p, m);
    int want = kwk_cpu_prefetch_l2() ? 2 : 1, ok = 1;
    for (int i = 0; i < N_MATS; i++)
        ok &= m[i]->prefetch == want;
    return ok;
}

/* The pack files of dir (not temporaries): how many, and the name of the one with `label`. */
static int list_packs(const char *dir, const char *label, char *name, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        n++;
        if (label && name && strstr(de->d_name, label))
            snprintf(name, cap, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    return n;
}

static int count_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        n += strstr(de->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

static ino_t inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* Whether path is still the file open as fd. Holding fd keeps its inode number from being
 * reused, so a file replaced by a rename is always told apart. */
static int same_file(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
           a.st_dev == b.st_dev;
}

static void patch(const char *path, long off, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    T_TRUE(fd >= 0 && pwrite(fd, bytes, n, off) == (ssize_t)n);
    close(fd);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static char root[256];

static void mkdir_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", root, name);
    mkdir(out, 0755);
}

/* The pack file's own checksum, recomputed the way packcache.c defines it (1 MiB chunks of the
 * file without its checksum field, each hashed with its index as seed, then the chunk hashes). */
static uint64_t recompute_checksum(const uint8_t *p, size_t size)
{
    const size_t chunk = (size_t)1 << 20, at = 24;
    const uint8_t *rp[2] = {p, p + at + 8};
    size_t rn[2] = {at, size - at - 8};
    uint64_t hs[4096];
    long n = 0;
    for (int r = 0; r < 2; r++)
        for (size_t off = 0; off < rn[r]; off += chunk, n++)
            hs[n] = kwk_hash64(rp[r] + off, KWK_MIN(chunk, rn[r] - off), (uint64_t)n);
    return kwk_hash64(hs, (size_t)n * 8, 2);
}

static void test_hash(void)
{
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (uint8_t)(i * 7);
    uint64_t h = kwk_hash64(buf, sizeof buf, 0);
    T_EQ(h, kwk_hash64(buf, sizeof buf, 0));
    T_TRUE(h != kwk_hash64(buf, sizeof buf, 1));
    T_TRUE(h != kwk_hash64(buf, sizeof buf - 1, 0));
    for (int i = 0; i < 1000; i += 37) {
        buf[i] ^= 0x10;
        T_TRUE(h != kwk_hash64(buf, sizeof buf, 0));
        buf[i] ^= 0x10;
    }
}

static void test_round_trip(const char *dir, int prec, const char *label)
{
    struct tmodel t;
    model_init(&t, 11);
    struct kwk_packed *ref = pack(&t, prec, NULL, 0);
    struct kwk_packed *first = pack(&t, prec, dir, 0); /* miss: packs into a new file */
    char path[600] = "";
    list_packs(dir, label, path, sizeof path);
    T_TRUE(path[0] != '\0');
    T_EQ(count_tmp(dir), 0);
    int held = open(path, O_RDONLY);
    struct kwk_packed *second = pack(&t, prec, dir, 0); /* hit: maps it */
    T_TRUE(same_file(held, path));
    T_TRUE(ref && first && second && same_blocks(ref, first) && same_blocks(ref, second));
    /* packed, packed into the cache, mapped from it: each sets its matrices' prefetch level */
    T_TRUE(ref && first && second && prefetch_default(ref) && prefetch_default(first) &&
           prefetch_default(second));
    kwk_packed_free(second);

    /* a changed checkpoint gets a file of its own */
    int before = list_packs(dir, NULL, NULL, 0);
    t.bufs[13][5] += 0.25f; /* layer 1's w_down */
    struct kwk_packed *changed_ref = pack(&t, prec, NULL, 0);
    struct kwk_packed *changed = pack(&t, prec, dir, 0);
    T_EQ(list_packs(dir, NULL, NULL, 0), before + 1);
    T_TRUE(changed && changed_ref && same_blocks(changed, changed_ref) &&
           !same_blocks(changed, ref));
    T_TRUE(same_file(held, path)); /* the old one is still there, untouched */
    close(held);
    kwk_packed_free(changed);
    kwk_packed_free(changed_ref);
    kwk_packed_free(first);
    kwk_packed_free(ref);
    model_free(&t);
}

/* Damage the pack of model seed 11 with fn, then load: it must be replaced (new inode) and give
 * the fresh blocks. */
static void expect_rebuilt(const char *dir, const char *what, void (*fn)(const char *))
{
    struct tmodel t;
    model_init(&t, 11);
    struct kwk_packed *ref = pack(&t, KWK_PRECISION_BALANCED, NULL, 0);
    kwk_packed_free(pack(&t, KWK_PRECISION_BALANCED, dir, 0));
    char path[600] = "";
    list_packs(dir, "balanced", path, sizeof path);
    int held = open(path, O_RDONLY);
    fn(path);
    struct kwk_packed *p = pack(&t, KWK_PRECISION_BALANCED, dir, 0);
    T_CHECK(inode(path) != 0 && !same_file(held, path), "%s: the pack file was not replaced",
            what);
    T_CHECK(p && same_blocks(p, ref), "%s: blocks differ from a fresh pack", what);
    /* and the new file is good: a hit */
    close(held);
    held = open(path, O_RDONLY);
    kwk_packed_free(p);
    p = pack(&t, KWK_PRECISION_BALANCED, dir, 0);
    T_CHECK(same_file(held, path) && p && same_blocks(p, ref), "%s: rebuilt file not reused",
            what);
    close(held);
    kwk_packed_free(p);
    kwk_packed_free(ref);
    model_free(&t);
}

static void corrupt_data(const char *path)
{
    uint8_t b;
    int fd = open(path, O_RDWR);
    T_TRUE(pread(fd, &b, 1, file_size(path) - 100) == 1);
    b ^= 0x01;
    T_TRUE(pwrite(fd, &b, 1, file_size(path) - 100) == 1);
    close(fd);
}

static void corrupt_table(const char *path)
{
    int64_t rows = 9999;
    patch(path, 64 + 8, &rows, sizeof rows); /* first record's rows */
}

static void truncate_file(const char *path)
{
    T_EQ(truncate(path, file_size(path) - 100), 0);
}

static void truncate_header(const char *path)
{
    T_EQ(truncate(path, 10), 0);
}

static void old_version(const char *path)
{
    uint32_t v = KWK_PACK_FORMAT_VERSION - 1;
    patch(path, 8, &v, sizeof v);
}

/* Packing changed but nobody bumped the version: blocks differ yet the checksum is right. */
static void stale_blocks(const char *path)
{
    int fd = open(path, O_RDWR);
    size_t size = (size_t)file_size(path);
    uint8_t *buf = malloc(size);
    T_TRUE(pread(fd, buf, size, 0) == (ssize_t)size);
    uint64_t off; /* of matrix 1 (layer 0's wk, the smallest: the one packed again to check) */
    memcpy(&off, buf + 64 + 40 + 24, 8);
    buf[off + 10] ^= 0x40;
    uint64_t sum = recompute_checksum(buf, size);
    memcpy(buf + 24, &sum, 8);
    T_TRUE(pwrite(fd, buf, size, 0) == (ssize_t)size);
    close(fd);
    free(buf);
}

static void test_rebuilds(void)
{
    char dir[300];
    mkdir_in(dir, sizeof dir, "rebuild");
    expect_rebuilt(dir, "corrupt byte", corrupt_data);
    expect_rebuilt(dir, "corrupt table", corrupt_table);
    expect_rebuilt(dir, "truncated", truncate_file);
    expect_rebuilt(dir, "truncated header", truncate_header);
    expect_rebuilt(dir, "older format", old_version);
    expect_rebuilt(dir, "stale blocks", stale_blocks);
    uint32_t v = 0;
    char path[600] = "";
    list_packs(dir, "balanced", path, sizeof path);
    int fd = open(path, O_RDONLY);
    T_TRUE(pread(fd, &v, 4, 8) == 4);
    close(fd);
    T_EQ(v, KWK_PACK_FORMAT_VERSION);
    T_EQ(list_packs(dir, NULL, NULL, 0), 1);
    T_EQ(count_tmp(dir), 0);
}

static void set_age(const char *path, int seconds_ago)
{
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= seconds_ago;
    ts[1] = ts[0];
    T_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void test_lru(void)
{
    char dir[300], pa[600] = "", pb[600] = "";
    mkdir_in(dir, sizeof dir, "lru");
    struct tmodel a, b, c, d;
    model_init(&a, 1);
    model_init(&b, 2);
    model_init(&c, 3);
    model_init(&d, 4);
    /* every model's pack has the same size: room for two and a half */
    kwk_packed_free(pack(&a, KWK_PRECISION_BALANCED, dir, 0));
    list_packs(dir, "balanced", pa, sizeof pa);
    int64_t limit = file_size(pa) * 5 / 2;
    set_age(pa, 300);
    kwk_packed_free(pack(&b, KWK_PRECISION_BALANCED, dir, limit));
    T_EQ(list_packs(dir, NULL, NULL, 0), 2);
    /* b's name: the file other than a's */
    DIR *dd = opendir(dir);
    struct dirent *de;
    while ((de = readdir(dd)) != NULL)
        if (de->d_name[0] != '.' && !strstr(pa, de->d_name))
            snprintf(pb, sizeof pb, "%s/%s", dir, de->d_name);
    closedir(dd);
    set_age(pb, 200);
    kwk_packed_free(pack(&a, KWK_PRECISION_BALANCED, dir, limit)); /* a used: now the newest */
    kwk_packed_free(pack(&c, KWK_PRECISION_BALANCED, dir, limit)); /* over: b goes */
    T_EQ(list_packs(dir, NULL, NULL, 0), 2);
    T_TRUE(inode(pa) != 0);
    T_EQ(inode(pb), 0);
    /* a stale temporary (a day old) counts and goes first; a young one is left alone */
    char stale[600], young[600];
    snprintf(stale, sizeof stale, "%s/.x.kwkpack.tmp.1.1", dir);
    snprintf(young, sizeof young, "%s/.y.kwkpack.tmp.1.2", dir);
    FILE *f = fopen(stale, "w");
    fputs("x", f);
    fclose(f);
    f = fopen(young, "w");
    fputs("y", f);
    fclose(f);
    set_age(stale, 2 * 86400);
    kwk_packed_free(pack(&d, KWK_PRECISION_BALANCED, dir, limit));
    T_EQ(inode(stale), 0);
    T_TRUE(inode(young) != 0);
    T_EQ(list_packs(dir, NULL, NULL, 0), 2);
    unlink(young);
    model_free(&a);
    model_free(&b);
    model_free(&c);
    model_free(&d);
}

static void test_unusable_dir(void)
{
    char file[300], dir[400];
    snprintf(file, sizeof file, "%s/plain-file", root);
    FILE *f = fopen(file, "w");
    fputs("not a directory", f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/sub", file);
    struct tmodel t;
    model_init(&t, 11);
    struct kwk_packed *ref = pack(&t, KWK_PRECISION_INT4, NULL, 0);
    struct kwk_packed *p = pack(&t, KWK_PRECISION_INT4, dir, 0); /* warns, packs in memory */
    T_TRUE(p && ref && same_blocks(p, ref));
    kwk_packed_free(p);
    kwk_packed_free(ref);
    model_free(&t);
}

/* Two processes pack the same model into an empty directory at once. */
static void test_concurrent(void)
{
    char dir[300];
    mkdir_in(dir, sizeof dir, "concurrent");
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            pool = kwk_pool_new(2); /* the parent's workers do not exist here */
            struct tmodel t;
            model_init(&t, 21);
            struct kwk_packed *ref = pack(&t, KWK_PRECISION_INT4, NULL, 0);
            struct kwk_packed *p = pack(&t, KWK_PRECISION_INT4, dir, 0);
            int ok = p && ref && same_blocks(p, ref) && t_failed == 0;
            if (!ok)
                fprintf(stderr, "child %d: p %p ref %p failed %d\n", k, (void *)p, (void *)ref,
                        t_failed);
            _exit(ok ? 0 : 1);
        }
    }
    for (int k = 0; k < 2; k++) {
        int status = -1;
        waitpid(kids[k], &status, 0);
        T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", k, status);
    }
    T_EQ(list_packs(dir, NULL, NULL, 0), 1);
    T_EQ(count_tmp(dir), 0);
    struct tmodel t;
    model_init(&t, 21);
    struct kwk_packed *ref = pack(&t, KWK_PRECISION_INT4, NULL, 0);
    char path[600] = "";
    list_packs(dir, "int4", path, sizeof path);
    int held = open(path, O_RDONLY);
    struct kwk_packed *p = pack(&t, KWK_PRECISION_INT4, dir, 0);
    T_TRUE(p && same_blocks(p, ref) && same_file(held, path));
    close(held);
    kwk_packed_free(p);
    kwk_packed_free(ref);
    model_free(&t);
}

/* One F32 matrix through kwk_packcache_open with sources `bytes` under source_id; the pack path
 * into path (if given); returns the status. A MISS is filled and committed, a HIT checked to hold
 * src. The sources lie in a read-only mapping of a file holding bytes, as the contract asks
 * (hashing drops their pages: in anonymous memory that would zero them). */
static int open_one(const char *dir, const uint8_t *bytes, size_t n, uint64_t source_id,
                    const float *src, char *path, size_t cap, int discard)
{
    char file[300];
    snprintf(file, sizeof file, "%s/sources", root);
    FILE *f = fopen(file, "wb");
    T_TRUE(f && fwrite(bytes, 1, n, f) == n);
    if (f)
        fclose(f);
    struct kwk_map map;
    struct kwk_err err = {0};
    T_EQ(kwk_map_file(&map, file, &err), 0);
    struct kwk_mat sm = {.wtype = KWK_W_F32, .rows = 4, .cols = 32, .data = src};
    struct kwk_mat dm = {.wtype = KWK_W_F32, .rows = 4, .cols = 32};
    struct kwk_pack_entry e = {&sm, &dm, 4 * 32 * sizeof(float)};
    struct kwk_pack_source s = {map.data, n};
    struct kwk_packcache_opts o = {
        .dir = dir, .label = "keys", .sources = &s, .n_sources = 1, .source_id = source_id,
        .drop_sources = 1};
    struct kwk_packcache *c = NULL;
    int st = kwk_packcache_open(&o, &e, 1, pool, &c);
    if (st == KWK_PACKCACHE_MISS) {
        memcpy((void *)dm.data, src, e.bytes);
        kwk_packcache_commit(c, pool);
    } else if (st == KWK_PACKCACHE_HIT) {
        T_TRUE(memcmp(dm.data, src, e.bytes) == 0);
    }
    if (path && c)
        snprintf(path, cap, "%s", kwk_packcache_path(c));
    if (discard)
        kwk_packcache_discard(c);
    else
        kwk_packcache_free(c);
    kwk_unmap(&map);
    return st;
}

static int count_suffix(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    size_t k = strlen(suffix);
    while (d && (de = readdir(d)) != NULL) {
        size_t m = strlen(de->d_name);
        n += de->d_name[0] != '.' && m > k && !strcmp(de->d_name + m - k, suffix);
    }
    if (d)
        closedir(d);
    return n;
}

/* Source keys: once sources are hashed under a source id, a later open with that id maps the
 * pack without reading them. Shown by changing the bytes under the same id (which a real file
 * cannot do: its id would change): the remembered pack is still mapped. KWKER_CACHE_REHASH=1, a
 * key naming a missing pack, a torn key and a discarded pack all hash the bytes again; a
 * new pack is always named by the bytes it was packed from. */
static void test_source_keys(void)
{
    char dir[300], key[700], p1[700] = "", p2[700] = "", p[700] = "";
    mkdir_in(dir, sizeof dir, "keys");
    snprintf(key, sizeof key, "%s/%016llx.kwksrc", dir, 0x1234567ull);
    float w[4 * 32];
    for (int i = 0; i < 4 * 32; i++)
        w[i] = rnd();
    uint8_t bytes[5000];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (uint8_t)(i * 13 + 5);

    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p1, sizeof p1, 0), KWK_PACKCACHE_MISS);
    T_EQ(file_size(key), 32);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    T_STREQ(p, p1);
    bytes[100] ^= 1; /* new bytes, the same id: mapped by the key, not hashed */
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    T_STREQ(p, p1);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0, w, p2, sizeof p2, 0), KWK_PACKCACHE_MISS);
    T_TRUE(strcmp(p2, p1) != 0); /* no id: hashed, a pack of the new bytes */

    setenv("KWKER_CACHE_REHASH", "1", 1);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    T_STREQ(p, p2);
    unsetenv("KWKER_CACHE_REHASH");
    /* the rehash rewrote the key: it now names the new bytes' pack */
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    T_STREQ(p, p2);

    /* a key naming a pack that is gone: hashed, packed under the bytes' own name */
    bytes[200] ^= 1;
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    unlink(p2);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_MISS);
    T_TRUE(strcmp(p, p1) != 0 && strcmp(p, p2) != 0);
    char p3[700];
    snprintf(p3, sizeof p3, "%s", p);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    T_STREQ(p, p3);

    /* a torn key is ignored (the bytes hashed) and written whole again */
    T_EQ(truncate(key, 20), 0);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x1234567, w, p, sizeof p, 0), KWK_PACKCACHE_HIT);
    T_STREQ(p, p3);
    T_EQ(file_size(key), 32);
    /* a key with another id in it (a renamed file) is ignored */
    char other[700];
    snprintf(other, sizeof other, "%s/%016llx.kwksrc", dir, 0x7654321ull);
    T_EQ(rename(key, other), 0);
    bytes[300] ^= 1;
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x7654321, w, p, sizeof p, 0), KWK_PACKCACHE_MISS);
    T_TRUE(strcmp(p, p3) != 0);

    /* discarding a pack found by a key removes the key too: the next open hashes */
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x7654321, w, p, sizeof p, 1), KWK_PACKCACHE_HIT);
    T_EQ(file_size(other), -1);
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x7654321, w, p, sizeof p, 0), KWK_PACKCACHE_MISS);
    T_EQ(file_size(other), 32);
    T_EQ(count_tmp(dir), 0);

    /* keys past 1024 go at a commit, least recently used first */
    for (int i = 0; i < 1100; i++) {
        char k[700];
        snprintf(k, sizeof k, "%s/%016x.kwksrc", dir, (unsigned)(0x10000 + i));
        FILE *f = fopen(k, "w");
        fputs("old", f);
        fclose(f);
        set_age(k, 1000 + i);
    }
    bytes[400] ^= 1;
    T_EQ(open_one(dir, bytes, sizeof bytes, 0x999, w, p, sizeof p, 0), KWK_PACKCACHE_MISS);
    T_EQ(count_suffix(dir, ".kwksrc"), 1024);
    snprintf(key, sizeof key, "%s/%016llx.kwksrc", dir, 0x999ull);
    T_EQ(file_size(key), 32);  /* the newest stay */
    snprintf(key, sizeof key, "%s/%016x.kwksrc", dir, (unsigned)(0x10000 + 1099));
    T_EQ(file_size(key), -1);  /* the oldest went */
    T_EQ(count_suffix(dir, ".kwkpack"), 4); /* of the bytes at 7 opens that packed, one discarded */
}

/* Sources in anonymous memory (a caller other than kwk_packed_new) keep their bytes unless the
 * caller says they lie in file mappings: dropping the pages of anonymous memory zeroes them,
 * which the second open shows. */
static void test_source_memory(void)
{
    char dir[300];
    mkdir_in(dir, sizeof dir, "memory");
    size_t n = 4 << 16; /* 256 KiB: whole pages whatever the page size */
    uint8_t *mem = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    T_TRUE(mem != MAP_FAILED);
    if (mem == MAP_FAILED)
        return;
    for (size_t i = 0; i < n; i++)
        mem[i] = (uint8_t)(i * 7 + 1);
    float w[4 * 32];
    for (int i = 0; i < 4 * 32; i++)
        w[i] = rnd();
    struct kwk_mat sm = {.wtype = KWK_W_F32, .rows = 4, .cols = 32, .data = w};
    for (int drop = 0; drop <= 1; drop++) {
        struct kwk_mat dm = {.wtype = KWK_W_F32, .rows = 4, .cols = 32};
        struct kwk_pack_entry e = {&sm, &dm, sizeof w};
        struct kwk_pack_source src = {mem, n};
        struct kwk_packcache_opts o = {.dir = dir, .label = "memory", .sources = &src,
                                       .n_sources = 1, .drop_sources = drop};
        struct kwk_packcache *c = NULL;
        int want = drop ? KWK_PACKCACHE_HIT : KWK_PACKCACHE_MISS;
        T_EQ(kwk_packcache_open(&o, &e, 1, pool, &c), want);
        if (!drop) {
            memcpy((void *)dm.data, w, sizeof w);
            kwk_packcache_commit(c, pool);
        }
        kwk_packcache_free(c);
        size_t kept = 0, zero = 0;
        for (size_t i = 0; i < n; i++) {
            kept += mem[i] == (uint8_t)(i * 7 + 1);
            zero += mem[i] == 0;
        }
        T_EQ(drop ? zero : kept, n);
    }
    munmap(mem, n);
}

/* kwk_file_id: what kwk_map_file fills in, and when it is settled. */
static void test_file_id(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/id-file", root);
    FILE *f = fopen(path, "w");
    fputs("some bytes", f);
    fclose(f);
    struct kwk_map m;
    struct kwk_err err = {0};
    T_EQ(kwk_map_file(&m, path, &err), 0);
    struct stat st;
    T_EQ(stat(path, &st), 0);
    T_EQ(m.id.ino, st.st_ino);
    T_EQ(m.id.dev, st.st_dev);
    T_EQ(m.id.size, 10);
    T_EQ(m.id.ctime_ns, (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec);
    T_EQ(kwk_file_id_settled(&m.id), 0); /* written just now */
    struct kwk_file_id old = m.id;
    old.mtime_ns -= 3000000000LL;
    old.ctime_ns -= 3000000000LL;
    T_EQ(kwk_file_id_settled(&old), 1);
    old.ctime_ns = m.id.ctime_ns;
    T_EQ(kwk_file_id_settled(&old), 0);
    struct kwk_file_id none = {0};
    T_EQ(kwk_file_id_settled(&none), 0);
    kwk_unmap(&m);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/kwk_test_packcache_%ld", (long)getpid());
    mkdir(root, 0755);
    pool = kwk_pool_new(2);
    test_hash();
    char dir[300];
    mkdir_in(dir, sizeof dir, "round");
    test_round_trip(dir, KWK_PRECISION_BALANCED, "balanced");
    test_round_trip(dir, KWK_PRECISION_INT4, "int4");
    test_rebuilds();
    test_lru();
    test_unusable_dir();
    test_concurrent();
    test_source_keys();
    test_source_memory();
    test_file_id();
    kwk_pool_free(pool);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return t_report("test_packcache");
}
