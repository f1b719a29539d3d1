// weights/hf.c — Hugging Face model directories (see hf.h).
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../util/check.h"

// JSON files other than weights are small; a larger one is refused with its size.
#define HF_MAX_JSON ((size_t)64 << 20)

int hf_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static char *join(const char *dir, const char *name) {
    char *p = xmalloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

char *hf_read_file(const char *dir, const char *name, int required, size_t *len, char *err,
                   size_t errlen) {
    char *path = join(dir, name);
    FILE *fp = fopen(path, "rb");
    struct stat sb;
    char *buf = NULL;
    if (err && errlen) err[0] = 0;
    if (!fp) {
        if (required || errno != ENOENT)
            err_printf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    } else if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode) ||
               (size_t)sb.st_size > HF_MAX_JSON) {
        err_printf(err, errlen, "%s: not a regular file of at most %zu MiB", path,
                   HF_MAX_JSON >> 20);
    } else {
        buf = xmalloc((size_t)sb.st_size + 1);
        *len = fread(buf, 1, (size_t)sb.st_size, fp);
        buf[*len] = 0;
        if (*len != (size_t)sb.st_size) {
            err_printf(err, errlen, "%s: read error", path);
            free(buf);
            buf = NULL;
        }
    }
    if (fp) fclose(fp);
    free(path);
    return buf;
}

json_t *hf_read_json(const char *dir, const char *name, int required, char *err,
                         size_t errlen) {
    size_t len;
    char *text = hf_read_file(dir, name, required, &len, err, errlen);
    if (!text) return NULL;
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    free(text);
    if (!json_is_object(j)) {
        err_printf(err, errlen, "%s/%s: not a JSON object (line %d: %s)", dir, name, je.line,
                   j ? "another JSON value" : je.text);
        json_decref(j);
        return NULL;
    }
    return j;
}

static int add_shard(hf_dir *h, const char *file, char *err, size_t errlen) {
    for (int i = 0; i < h->n_shards; i++)
        if (strcmp(strrchr(h->shards[i]->path, '/') + 1, file) == 0) return 0;
    if (!*file || strchr(file, '/') || strcmp(file, "..") == 0 || strcmp(file, ".") == 0)
        return err_printf(err, errlen,
                          "%s/model.safetensors.index.json names shard '%s', which "
                          "is not a file name in the directory",
                          h->path, file);
    char *path = join(h->path, file);
    struct stat sb;
    st_file *f = NULL;
    if (stat(path, &sb) != 0)
        err_printf(err, errlen, "missing shard %s (listed in model.safetensors.index.json)", path);
    else
        f = st_open(path, err, errlen);
    free(path);
    if (!f) return -1;
    h->shards = xrealloc(h->shards, (size_t)(h->n_shards + 1) * sizeof *h->shards);
    h->shards[h->n_shards++] = f;
    return 0;
}

// Sharded weights: every file of the index's weight_map, each tensor checked to be in its shard.
static int open_index(hf_dir *h, json_t *index, char *err, size_t errlen) {
    json_t *map = json_object_get(index, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0)
        return err_printf(err, errlen, "%s/model.safetensors.index.json has no weight_map object",
                          h->path);
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        if (!json_is_string(file))
            return err_printf(err, errlen,
                              "%s/model.safetensors.index.json: weight_map['%s'] is "
                              "not a file name",
                              h->path, name);
        if (add_shard(h, json_string_value(file), err, errlen)) return -1;
        const st_file *sh = NULL;
        for (int i = 0; i < h->n_shards; i++)
            if (strcmp(strrchr(h->shards[i]->path, '/') + 1, json_string_value(file)) == 0)
                sh = h->shards[i];
        if (!st_find(sh, name))
            return err_printf(err, errlen, "%s: tensor '%s' listed by the index is not in it",
                              sh->path, name);
    }
    return 0;
}

static int open_weights(hf_dir *h, char *err, size_t errlen) {
    json_t *index = hf_read_json(h->path, "model.safetensors.index.json", 0, err, errlen);
    if (index) {
        int rc = open_index(h, index, err, errlen);
        json_decref(index);
        return rc;
    }
    if (err[0]) return -1;
    char *single = join(h->path, "model.safetensors");
    struct stat sb;
    int present = stat(single, &sb) == 0;
    free(single);
    if (!present)
        return err_printf(err, errlen,
                          "%s has neither model.safetensors nor "
                          "model.safetensors.index.json",
                          h->path);
    return add_shard(h, "model.safetensors", err, errlen);
}

hf_dir *hf_open(const char *path, char *err, size_t errlen) {
    hf_dir *h = xcalloc(1, sizeof *h);
    h->path = strdup(path);
    CHECK_INTERNAL(h->path, "out of memory");
    size_t n = strlen(h->path);
    while (n > 1 && h->path[n - 1] == '/')
        h->path[--n] = 0;
    h->config = hf_read_json(h->path, "config.json", 1, err, errlen);
    if (!h->config || open_weights(h, err, errlen) != 0) {
        hf_close(h);
        return NULL;
    }
    return h;
}

void hf_close(hf_dir *h) {
    if (!h) return;
    for (int i = 0; i < h->n_shards; i++)
        st_close(h->shards[i]);
    free(h->shards);
    json_decref(h->config);
    free(h->path);
    free(h);
}

const st_tensor *hf_find_tensor(const hf_dir *h, const char *name) {
    for (int i = 0; i < h->n_shards; i++) {
        const st_tensor *t = st_find(h->shards[i], name);
        if (t) return t;
    }
    return NULL;
}

// The value at a dotted key, or NULL (absent or JSON null).
static const json_t *cfg_get(const hf_dir *h, const char *key) {
    const json_t *j = h->config;
    char part[128];
    while (j && *key) {
        size_t n = strcspn(key, ".");
        if (n >= sizeof part || !json_is_object(j)) return NULL;
        memcpy(part, key, n);
        part[n] = 0;
        j = json_object_get(j, part);
        key += n + (key[n] == '.');
    }
    return json_is_null(j) ? NULL : j;
}

int hf_cfg_int(const hf_dir *h, const char *key, long long *out) {
    const json_t *j = cfg_get(h, key);
    if (!j) return 1;
    if (!json_is_integer(j)) return -1;
    *out = json_integer_value(j);
    return 0;
}

int hf_cfg_num(const hf_dir *h, const char *key, double *out) {
    const json_t *j = cfg_get(h, key);
    if (!j) return 1;
    if (!json_is_number(j)) return -1;
    *out = json_number_value(j);
    return 0;
}

int hf_cfg_bool(const hf_dir *h, const char *key, int *out) {
    const json_t *j = cfg_get(h, key);
    if (!j) return 1;
    if (!json_is_boolean(j)) return -1;
    *out = json_is_true(j);
    return 0;
}

const char *hf_cfg_str(const hf_dir *h, const char *key) {
    const json_t *j = cfg_get(h, key);
    return json_is_string(j) ? json_string_value(j) : NULL;
}

const char *hf_cfg_arch(const hf_dir *h) {
    const json_t *a = json_object_get(h->config, "architectures");
    const json_t *a0 = json_is_array(a) ? json_array_get(a, 0) : NULL;
    return json_is_string(a0) ? json_string_value(a0) : NULL;
}

const char *hf_arch_family(const hf_dir *h) {
    static const struct {
        const char *arch, *family;
    } KNOWN[] = {
        {"LlamaForCausalLM", "llama"},
        {"LlamaSwiftKVForCausalLM", "llama"},
        {"Qwen2ForCausalLM", "qwen2"},
    };
    const char *a = hf_cfg_arch(h);
    for (size_t i = 0; a && i < sizeof KNOWN / sizeof *KNOWN; i++)
        if (strcmp(a, KNOWN[i].arch) == 0) return KNOWN[i].family;
    return NULL;
}
