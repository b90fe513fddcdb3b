/* file.c - mapping and reading files, paths. Any thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"

int kwk_map_file(struct kwk_map *m, const char *path, struct kwk_err *err)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kwk_err_set(err, errno == ENOENT ? KWK_ENOTFOUND : -errno, "%s: %s", path,
                           strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = kwk_err_set(err, -errno, "%s: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = kwk_err_set(err, KWK_EFORMAT, "%s: not a regular file", path);
        goto out_close;
    }
    m->id = (struct kwk_file_id){(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                                 (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
                                 (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec};
    if (st.st_size == 0)
        goto out_close;
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = kwk_err_set(err, -errno, "%s: mmap: %s", path, strerror(errno));
        goto out_close;
    }
    m->data = p;
    m->size = (size_t)st.st_size;
out_close:
    close(fd);
    return rc;
}

int kwk_file_id_settled(const struct kwk_file_id *id)
{
    struct timespec now;
    if (!id->ino || clock_gettime(CLOCK_REALTIME, &now) != 0)
        return 0;
    int64_t t = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec - 1000000000;
    return id->mtime_ns < t && id->ctime_ns < t;
}

void kwk_unmap(struct kwk_map *m)
{
    if (m && m->data)
        munmap((void *)m->data, m->size);
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}

void kwk_map_release(const struct kwk_map *m)
{
    /* read-only file mappings only: MADV_DONTNEED on anonymous memory would zero it */
    if (m && m->data)
        madvise((void *)m->data, m->size, MADV_DONTNEED);
}

int kwk_read_file(const char *path, size_t limit, char **out, size_t *n, struct kwk_err *err)
{
    *out = NULL;
    if (n)
        *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kwk_err_set(err, errno == ENOENT ? KWK_ENOTFOUND : -errno, "%s: %s", path,
                           strerror(errno));
    int rc = 0;
    size_t len = 0, cap = 4096;
    char *buf = kwk_malloc(cap);
    if (!buf) {
        rc = kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
        goto out_close;
    }
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > limit) {
                rc = kwk_err_set(err, KWK_ELIMIT, "%s: larger than %zu bytes", path, limit);
                goto out_free;
            }
            char *nb = kwk_realloc(buf, cap * 2);
            if (!nb) {
                rc = kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
                goto out_free;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - 1 - len, f);
        if (got == 0)
            break;
        len += got;
    }
    if (ferror(f)) {
        rc = kwk_err_set(err, -EIO, "%s: read error", path);
        goto out_free;
    }
    if (len > limit) {
        rc = kwk_err_set(err, KWK_ELIMIT, "%s: larger than %zu bytes", path, limit);
        goto out_free;
    }
    buf[len] = '\0';
    *out = buf;
    if (n)
        *n = len;
    goto out_close;
out_free:
    kwk_free(buf);
out_close:
    fclose(f);
    return rc;
}

int kwk_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kwk_dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int kwk_path_join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? KWK_ELIMIT : 0;
}
