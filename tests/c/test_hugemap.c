/* test_hugemap.c - kwk_map_huge (base/hugemap.c) is advice only: whatever it does to the page
 * cache and the mapping's pages, the bytes read through the mapping stay the file's, it never
 * fails on files too small, empty, removed or unreadable for a second open, and a second call
 * agrees with the first. Whether huge pages come depends on the kernel and file system: printed,
 * not asserted. Single-threaded test driver. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "test.h"

/* A file of n pseudo-random bytes written with write() (so its page cache starts in small
 * pages, dirty); returns its contents (caller frees) or NULL. */
static uint8_t *make_file(const char *path, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    uint64_t s = 0x9e3779b97f4a7c15u ^ n;
    for (size_t i = 0; b && i < n; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        b[i] = (uint8_t)(s >> 56);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!b || fd < 0 || write(fd, b, n) != (ssize_t)n) {
        free(b);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    close(fd);
    return b;
}

static void check_file(const char *path, size_t n)
{
    uint8_t *want = make_file(path, n);
    T_TRUE(want != NULL);
    struct kwk_map m;
    struct kwk_err err = {0};
    T_EQ(kwk_map_file(&m, path, &err), 0);
    int first = kwk_map_huge(&m, path);
    T_TRUE(first == 0 || first == 1);
    T_TRUE(m.size == n && (n == 0 || (want && !memcmp(m.data, want, n))));
    int second = kwk_map_huge(&m, path);
    T_TRUE(second >= first); /* huge stays huge */
    T_TRUE(m.size == n && (n == 0 || (want && !memcmp(m.data, want, n))));
    if (n >= (8u << 20))
        printf("  %zu MiB file: %s\n", n >> 20, first ? "on 2 MiB pages" : "on small pages");
    if (n < (4u << 20))
        T_EQ(first, 0); /* no whole 2 MiB page to gain */
    kwk_unmap(&m);
    free(want);
}

int main(void)
{
    char dir[] = "/tmp/kwk_hugemap_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/w.bin", dir);

    check_file(path, 0);
    check_file(path, 3 << 20);
    check_file(path, (16 << 20) + 12345); /* not a whole number of pages */

    /* removed before the call (its second open fails): still advice only */
    uint8_t *want = make_file(path, 16 << 20);
    T_TRUE(want != NULL);
    struct kwk_map m;
    struct kwk_err err = {0};
    T_EQ(kwk_map_file(&m, path, &err), 0);
    unlink(path);
    int r = kwk_map_huge(&m, path);
    T_TRUE(r == 0 || r == 1);
    T_TRUE(want && m.size == (16u << 20) && !memcmp(m.data, want, m.size));
    kwk_unmap(&m);
    free(want);

    /* KWKER_HUGE_PAGES=0: the page cache is left alone, the bytes are the same */
    setenv("KWKER_HUGE_PAGES", "0", 1);
    check_file(path, 16 << 20);
    unsetenv("KWKER_HUGE_PAGES");

    /* an empty map (kwk_map_file of an empty file) and a mapping-less call */
    struct kwk_map none = {0};
    T_EQ(kwk_map_huge(&none, path), 0);

    unlink(path);
    rmdir(dir);
    return t_report("test_hugemap");
}
