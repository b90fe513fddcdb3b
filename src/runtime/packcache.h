/* packcache.h - the packed-weight cache: a model's repacked (balanced / int4) matrices kept in one
 * file per model x precision, found again by the weights' content and mapped without a copy.
 * Called on a decoder's owner thread (its pool may help hash); a mapped pack is read-only. */
#ifndef KWK_PACKCACHE_H
#define KWK_PACKCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "kernels/kernels.h"

/* The layout of a pack file and of every block it holds. Bump it whenever kernels/quant.h's block
 * structs, group sizes or row interleaving change, or packing computes different numbers from
 * the same floats: files of another version are packed again and replaced. */
#define KWK_PACK_FORMAT_VERSION 3 /* 3: int4 keeps a Q4_0 / Q4_1 / Q4_K file's grid */

/* Default size limit of a cache directory: 16 GiB (KWKER_CACHE_MAX or a parameter overrides). */
#define KWK_PACK_CACHE_MAX_DEFAULT ((int64_t)16 << 30)

/* Bytes that key a pack. */
struct kwk_pack_source {
    const void *data;
    size_t n;
};

struct kwk_packcache_opts {
    const char *dir;   /* the cache directory (created if missing); NULL or "" = no cache */
    int64_t max_bytes; /* directory size limit; 0 = $KWKER_CACHE_MAX (bytes, K/M/G suffix ok)
                        * or KWK_PACK_CACHE_MAX_DEFAULT */
    const char *label; /* goes into the file name ("balanced", "int4"): for people, not keys */
    uint64_t salt;     /* anything else the packed numbers depend on (calibration...): keyed */
    /* The checkpoint's tensors as stored in its files: when given, their bytes (and salt, which
     * must then cover what turns them into the matrices: config, tying) key the pack instead
     * of the matrices' own bytes: a Q4_1 GGUF's tensors are far fewer bytes than the matrices
     * dequantized to float32. NULL: the matrices' bytes. kwk_packed_new fills these itself.
     * See drop_sources for what hashing does to their pages. */
    const struct kwk_pack_source *sources;
    int n_sources;
    /* 1: every source lies in a PROT_READ file mapping (kwk_map_file), so once hashed its whole
     * pages can leave this process's resident memory (MADV_DONTNEED: they fault back in from
     * the page cache if read again) and a checkpoint does not stay resident beside its pack.
     * On any other memory that would zero it: 0 (the default) keeps every page. */
    int drop_sources;
    /* A key for the sources' bytes that costs no reading: the ids of the (settled) files they lie
     * in and where in them (kwk_packed_new makes it); 0 = none. A pack found under it is mapped
     * without hashing the sources (KWKER_CACHE_REHASH=1 hashes them at every load); a miss
     * hashes them all the same, so a pack is always named by the bytes it was packed from. */
    uint64_t source_id;
};

/* One matrix to pack: src is read (F32, F16 or BF16), dst has wtype, rows and cols set by the
 * caller; the cache sets dst->data. bytes = kwk_quant_bytes of dst. */
struct kwk_pack_entry {
    const struct kwk_mat *src;
    struct kwk_mat *dst;
    size_t bytes;
};

struct kwk_packcache;

enum {
    KWK_PACKCACHE_OFF = 0,  /* no cache: the caller packs into memory of its own */
    KWK_PACKCACHE_HIT = 1,  /* every dst->data points into a verified, mapped pack file */
    KWK_PACKCACHE_MISS = 2, /* every dst->data points into a new writable file: pack into it,
                             * then kwk_packcache_commit */
};

/* Find the pack of e[n] in o->dir by the sources' content (hashed on pool) and the target
 * wtypes, or start a new one. A file of another format version, a corrupt or truncated one is
 * logged (naming the file), removed and packed again. Never fails the load: when the directory
 * cannot be used it logs a warning and returns KWK_PACKCACHE_OFF. *out is the mapping to free
 * (NULL for OFF). */
int kwk_packcache_open(const struct kwk_packcache_opts *o, struct kwk_pack_entry *e, int n,
                       struct kwk_pool *pool, struct kwk_packcache **out);
/* After a MISS, once the blocks are packed: checksum, fsync and rename the file into place,
 * make the mapping read-only, evict least recently used files over the limit. On a write error
 * it logs a warning and the packed blocks stay valid in memory. */
void kwk_packcache_commit(struct kwk_packcache *c, struct kwk_pool *pool);
/* After a HIT whose blocks turned out wrong: remove the file (unless another process has
 * replaced it meanwhile) and the source key that led to it, and free c. Accepts NULL. */
void kwk_packcache_discard(struct kwk_packcache *c);
/* Unmap (the dst matrices pointing into it die with it). Accepts NULL. */
void kwk_packcache_free(struct kwk_packcache *c);
/* The pack file's path. */
const char *kwk_packcache_path(const struct kwk_packcache *c);

/* A 64-bit non-cryptographic hash of p[n] (four independent multiply-rotate lanes, so it runs
 * at memory speed): detects changed bytes, not adversaries. */
uint64_t kwk_hash64(const void *p, size_t n, uint64_t seed);

/* A progress bar on stderr while packing, drawn only when stderr is a terminal, KWKER_LOG is not
 * "error" and the work has taken over 0.3 s. */
struct kwk_progress {
    double t0;
    int tty, shown;
    const char *what;
};
void kwk_progress_init(struct kwk_progress *pr, const char *what);
void kwk_progress_update(struct kwk_progress *pr, long done, long total);
void kwk_progress_end(struct kwk_progress *pr);

#endif
