// lora_spec — see lora_spec.h.
#define _GNU_SOURCE
#include "lora_spec.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_FORMS "expected name=path, name=path:pinned, a path, or JSON {\"lora_name\": ..., \"lora_path\": ...}"

static int s_fail(lora_spec_t *spec, char *err, size_t errlen, const char *value, const char *why) {
    lora_spec_clear(spec);
    snprintf(err, errlen, "adapter \"%s\": %s", value, why);
    return -1;
}

// A name is what clients send as "model" / "lora_path": no separators that would make it a
// path or another form.
static bool s_name_ok(const char *name) {
    return name[0] && !strpbrk(name, "/={}\"") && strcmp(name, ".") && strcmp(name, "..");
}

static int s_json(const char *value, lora_spec_t *spec, char *err, size_t errlen) {
    cJSON *o = cJSON_Parse(value);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return s_fail(spec, err, errlen, value, "not a JSON object; " S_FORMS);
    }
    const char *why = NULL;
    cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *k = it->string;
        if (!strcmp(k, "lora_name") || !strcmp(k, "name") || !strcmp(k, "lora_path") || !strcmp(k, "path") ||
            !strcmp(k, "base_model_name")) {
            if (!cJSON_IsString(it) && !(cJSON_IsNull(it) && !strcmp(k, "base_model_name")))
                why = "name, path and base_model_name must be strings";
        } else if (!strcmp(k, "pinned")) {
            if (!cJSON_IsBool(it))
                why = "\"pinned\" must be true or false";
        } else
            why = "unknown key (SGLang's are lora_name, lora_path, pinned; vLLM's name, path, base_model_name)";
    }
    cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "lora_name"), *path = cJSON_GetObjectItemCaseSensitive(o, "lora_path");
    cJSON *vname = cJSON_GetObjectItemCaseSensitive(o, "name"), *vpath = cJSON_GetObjectItemCaseSensitive(o, "path");
    if (!why && ((name && vname) || (path && vpath)))
        why = "give lora_name/lora_path (SGLang) or name/path (vLLM), not both";
    name = name ? name : vname;
    path = path ? path : vpath;
    if (!why && (!name || !path))
        why = "needs a name (lora_name or name) and a path (lora_path or path)";
    if (!why) {
        spec->name = strdup(name->valuestring);
        spec->path = strdup(path->valuestring);
        spec->pinned = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "pinned"));
    }
    cJSON_Delete(o);
    return why ? s_fail(spec, err, errlen, value, why) : 0;
}

int lora_spec_parse(const char *value, lora_spec_t *spec, char *err, size_t errlen) {
    *spec = (lora_spec_t){0};
    if (!value || !value[0])
        return s_fail(spec, err, errlen, value ? value : "", "empty; " S_FORMS);
    if (value[0] == '{') {
        if (s_json(value, spec, err, errlen) < 0)
            return -1;
    } else {
        // ":pinned" ends the value in either form (SGLang's name=path:pinned).
        size_t vlen = strlen(value);
        bool pinned = vlen > 7 && !strcmp(value + vlen - 7, ":pinned");
        if (pinned)
            vlen -= 7;
        const char *eq = memchr(value, '=', vlen);
        if (eq) {
            spec->name = strndup(value, (size_t)(eq - value));
            spec->path = strndup(eq + 1, vlen - (size_t)(eq + 1 - value));
        } else {
            // A plain path: its directory's basename names it (SGLang).
            size_t len = vlen;
            while (len > 1 && value[len - 1] == '/')
                len--;
            const char *base = value;
            for (size_t i = 0; i < len; i++)
                if (value[i] == '/')
                    base = value + i + 1;
            spec->name = strndup(base, (size_t)(value + len - base));
            spec->path = strndup(value, vlen);
        }
        spec->pinned = pinned;
    }
    if (!spec->name || !spec->path)
        return s_fail(spec, err, errlen, value, "out of memory");
    if (!s_name_ok(spec->name))
        return s_fail(spec, err, errlen, value, "the name is empty or has / = { } or \"; " S_FORMS);
    if (!spec->path[0])
        return s_fail(spec, err, errlen, value, "the path is empty; " S_FORMS);
    return 0;
}

void lora_spec_clear(lora_spec_t *spec) {
    if (!spec)
        return;
    free(spec->name);
    free(spec->path);
    *spec = (lora_spec_t){0};
}
