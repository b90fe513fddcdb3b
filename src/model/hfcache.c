/* hfcache.c - resolving a Hugging Face id (ORG/NAME) to a snapshot folder of the local hub cache,
 * offline: Kwker never downloads. Any thread. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/model.h"

/* ORG/NAME with exactly one slash, no empty part, no "." or ".." part. */
static int is_hf_id(const char *s)
{
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/'))
        return 0;
    if (s[0] == '.' || slash[1] == '.')
        return 0;
    for (const char *p = s; *p; p++)
        if (*p == '\\' || (unsigned char)*p < 0x20)
            return 0;
    return 1;
}

static int hub_dir(char *out, size_t cap)
{
    const char *e = getenv("HF_HUB_CACHE");
    int n;
    if (e && *e)
        n = snprintf(out, cap, "%s", e);
    else if ((e = getenv("HF_HOME")) && *e)
        n = snprintf(out, cap, "%s/hub", e);
    else if ((e = getenv("HOME")) && *e)
        n = snprintf(out, cap, "%s/.cache/huggingface/hub", e);
    else
        n = snprintf(out, cap, "/root/.cache/huggingface/hub");
    return n < 0 || (size_t)n >= cap ? KWK_ELIMIT : 0;
}

/* The revision named by refs/main, if that snapshot exists. */
static int from_ref(const char *repo, char *out, size_t cap)
{
    char path[4096], *rev = NULL;
    size_t n = 0;
    if (kwk_path_join(path, sizeof path, repo, "refs/main") || !kwk_file_exists(path))
        return -1;
    if (kwk_read_file(path, 256, &rev, &n, NULL))
        return -1;
    while (n > 0 && (rev[n - 1] == '\n' || rev[n - 1] == '\r' || rev[n - 1] == ' '))
        rev[--n] = '\0';
    int rc = -1;
    if (n > 0 && !strchr(rev, '/')) {
        int k = snprintf(out, cap, "%s/snapshots/%s", repo, rev);
        rc = k > 0 && (size_t)k < cap && kwk_dir_exists(out) ? 0 : -1;
    }
    kwk_free(rev);
    return rc;
}

/* Without refs/main: the only snapshot, or the most recently modified one. */
static int from_snapshots(const char *repo, char *out, size_t cap)
{
    char dir[4096];
    if (kwk_path_join(dir, sizeof dir, repo, "snapshots"))
        return -1;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *e;
    double best_t = -1.0;
    int rc = -1;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[4096];
        struct stat st;
        if (kwk_path_join(sub, sizeof sub, dir, e->d_name) || stat(sub, &st) != 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        double t = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
        if (t > best_t && strlen(sub) < cap) {
            best_t = t;
            memcpy(out, sub, strlen(sub) + 1);
            rc = 0;
        }
    }
    closedir(d);
    return rc;
}

int kwk_hf_resolve(const char *path_or_id, char *out, size_t cap, struct kwk_err *err)
{
    if (!path_or_id || !out || cap == 0)
        return kwk_err_set(err, KWK_EARG, "kwk_hf_resolve: NULL argument");
    struct stat st;
    if (stat(path_or_id, &st) == 0) {
        if (strlen(path_or_id) >= cap)
            return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", path_or_id);
        memcpy(out, path_or_id, strlen(path_or_id) + 1);
        return 0;
    }
    if (!is_hf_id(path_or_id))
        return kwk_err_set(err, KWK_ENOTFOUND, "%s: no such file or folder", path_or_id);
    char hub[2048], repo[4096];
    if (hub_dir(hub, sizeof hub))
        return kwk_err_set(err, KWK_ELIMIT, "%s: cache path too long", path_or_id);
    const char *slash = strchr(path_or_id, '/');
    int n = snprintf(repo, sizeof repo, "%s/models--%.*s--%s", hub, (int)(slash - path_or_id),
                     path_or_id, slash + 1);
    if (n < 0 || (size_t)n >= sizeof repo)
        return kwk_err_set(err, KWK_ELIMIT, "%s: cache path too long", path_or_id);
    if (from_ref(repo, out, cap) == 0 || from_snapshots(repo, out, cap) == 0)
        return 0;
    return kwk_err_set(err, KWK_ENOTFOUND,
                       "%s: not a path, and not in the Hugging Face cache (looked for %s); Kwker "
                       "never downloads: fetch it first (e.g. huggingface-cli download %s)",
                       path_or_id, repo, path_or_id);
}
