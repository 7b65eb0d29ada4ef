/* The ortqnn backend's compiler driver (hexbundle/backends/ortqnn.py builds it with mingw-w64's
 * x86_64-w64-mingw32-gcc and runs it under wine64, or natively on Windows x64).
 *
 * It compiles QDQ ONNX graphs into one QNN HTP context binary through ONNX Runtime's QNN
 * execution provider (onnxruntime-qnn's plugin EP), the way an EPContext model is made:
 *
 *   ortqnn_driver.exe compile ORT_DLL EP_DLL [--ep KEY=VALUE]... [--session KEY=VALUE]...
 *                     -- MODEL OUT [MODEL OUT]...
 *
 * For each MODEL a session is created with EPContext generation on (ep.context_enable=1,
 * ep.context_file_path=OUT, embed mode 0): ONNX Runtime writes OUT (the EPContext model) and
 * the EP writes the context binary beside it (OUT's stem + "_qnn.bin"). With more than one
 * MODEL, every session sets ep.share_ep_contexts=1 and the last also ep.stop_share_ep_contexts=1:
 * the graphs go into ONE context binary, their weights stored once, named after the first OUT.
 * --ep options go to the EP (backend_path, soc_model, htp_arch, ...); --session options are
 * session config entries added to every session.
 *
 * ONNX Runtime's C API is reached through OrtGetApiBase() of ORT_DLL (loaded at run time, so
 * the driver builds without ONNX Runtime present) and its OrtApi table of function pointers.
 * Only the entries used here are declared: the table only ever grows at its end, so their
 * positions (ORT_SLOT_*) hold for every ONNX Runtime from API version ORT_API_VERSION on.
 * Exit status: 0 done, 2 ONNX Runtime refused (its message on stderr), 1 bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <windows.h>

#define ORT_API_VERSION 22   /* RegisterExecutionProviderLibrary and GetEpDevices: 1.22 */

typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtEpDevice OrtEpDevice;

typedef struct OrtApiBase {
    const void *(*GetApi)(unsigned int version);
    const char *(*GetVersionString)(void);
} OrtApiBase;
typedef const OrtApiBase *(*GetApiBaseFn)(void);

/* Positions in the OrtApi table (onnxruntime_c_api.h's struct OrtApi, in declaration order). */
enum {
    ORT_SLOT_GetErrorMessage = 2,
    ORT_SLOT_CreateEnv = 3,
    ORT_SLOT_CreateSession = 7,
    ORT_SLOT_CreateSessionOptions = 10,
    ORT_SLOT_ReleaseEnv = 92,
    ORT_SLOT_ReleaseStatus = 93,
    ORT_SLOT_ReleaseSession = 95,
    ORT_SLOT_ReleaseSessionOptions = 100,
    ORT_SLOT_AddSessionConfigEntry = 130,
    ORT_SLOT_RegisterExecutionProviderLibrary = 301,
    ORT_SLOT_GetEpDevices = 303,
    ORT_SLOT_SessionOptionsAppendExecutionProvider_V2 = 304,
    ORT_SLOT_EpDevice_EpName = 312,
};
#define ORT_LOGGING_LEVEL_WARNING 2

static void *const *api;   /* the OrtApi table */
#define FN(type, slot) ((type)api[ORT_SLOT_##slot])

typedef const char *(*GetErrorMessageFn)(const OrtStatus *);
typedef OrtStatus *(*CreateEnvFn)(int, const char *, OrtEnv **);
typedef OrtStatus *(*CreateSessionFn)(OrtEnv *, const wchar_t *, const OrtSessionOptions *,
                                      OrtSession **);
typedef OrtStatus *(*CreateSessionOptionsFn)(OrtSessionOptions **);
typedef void (*ReleaseFn)(void *);
typedef OrtStatus *(*AddSessionConfigEntryFn)(OrtSessionOptions *, const char *, const char *);
typedef OrtStatus *(*RegisterEpLibraryFn)(OrtEnv *, const char *, const wchar_t *);
typedef OrtStatus *(*GetEpDevicesFn)(const OrtEnv *, const OrtEpDevice *const **, size_t *);
typedef OrtStatus *(*AppendEpV2Fn)(OrtSessionOptions *, OrtEnv *, const OrtEpDevice *const *,
                                   size_t, const char *const *, const char *const *, size_t);
typedef const char *(*EpDeviceNameFn)(const OrtEpDevice *);

#define MAX_OPTIONS 64

static void check(OrtStatus *status, const char *what) {
    if (status) {
        fprintf(stderr, "ortqnn_driver: %s: %s\n", what,
                FN(GetErrorMessageFn, GetErrorMessage)(status));
        FN(ReleaseFn, ReleaseStatus)(status);
        exit(2);
    }
}

static wchar_t *wide(const char *s) {
    int n = MultiByteToWideChar(CP_UTF8, 0, s, -1, NULL, 0);
    wchar_t *w = malloc(n * sizeof(wchar_t));
    if (!w) { fprintf(stderr, "ortqnn_driver: out of memory\n"); exit(2); }
    MultiByteToWideChar(CP_UTF8, 0, s, -1, w, n);
    return w;
}

static int usage(void) {
    fprintf(stderr, "usage: ortqnn_driver.exe compile ORT_DLL EP_DLL [--ep K=V]... "
                    "[--session K=V]... -- MODEL OUT [MODEL OUT]...\n");
    return 1;
}

/* "KEY=VALUE" split in place into keys[n], vals[n]. */
static int split_option(char *arg, const char **keys, const char **vals, int *n) {
    char *eq = strchr(arg, '=');
    if (!eq || *n >= MAX_OPTIONS) return 0;
    *eq = 0;
    keys[*n] = arg;
    vals[*n] = eq + 1;
    (*n)++;
    return 1;
}

/* The EP device the QNN plugin library offers (its EP name contains "QNN"). */
static const OrtEpDevice *qnn_device(OrtEnv *env) {
    const OrtEpDevice *const *devices;
    size_t count;
    check(FN(GetEpDevicesFn, GetEpDevices)(env, &devices, &count), "GetEpDevices");
    for (size_t i = 0; i < count; i++)
        if (strstr(FN(EpDeviceNameFn, EpDevice_EpName)(devices[i]), "QNN")) return devices[i];
    fprintf(stderr, "ortqnn_driver: the EP library registered no QNN device\n");
    exit(2);
}

static void add_config(OrtSessionOptions *so, const char *key, const char *value) {
    check(FN(AddSessionConfigEntryFn, AddSessionConfigEntry)(so, key, value), key);
}

int main(int argc, char **argv) {
    const char *ep_keys[MAX_OPTIONS], *ep_vals[MAX_OPTIONS];
    const char *session_keys[MAX_OPTIONS], *session_vals[MAX_OPTIONS];
    int n_ep = 0, n_session = 0, i;
    if (argc < 4 || strcmp(argv[1], "compile") != 0) return usage();
    for (i = 4; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--ep") ? !split_option(argv[i + 1], ep_keys, ep_vals, &n_ep)
            : !strcmp(argv[i], "--session")
                ? !split_option(argv[i + 1], session_keys, session_vals, &n_session)
                : 1)
            return usage();
    }
    int first = i + 1, pairs = (argc - first) / 2;
    if (i >= argc || pairs < 1 || (argc - first) % 2) return usage();

    HMODULE ort_dll = LoadLibraryW(wide(argv[2]));
    if (!ort_dll) {
        fprintf(stderr, "ortqnn_driver: cannot load %s (error %lu)\n", argv[2], GetLastError());
        return 2;
    }
    GetApiBaseFn get_base = (GetApiBaseFn)(void *)GetProcAddress(ort_dll, "OrtGetApiBase");
    if (!get_base) { fprintf(stderr, "ortqnn_driver: %s has no OrtGetApiBase\n", argv[2]); return 2; }
    api = get_base()->GetApi(ORT_API_VERSION);
    if (!api) {
        fprintf(stderr, "ortqnn_driver: ONNX Runtime %s lacks API version %d\n",
                get_base()->GetVersionString(), ORT_API_VERSION);
        return 2;
    }
    printf("onnxruntime %s\n", get_base()->GetVersionString());

    OrtEnv *env;
    check(FN(CreateEnvFn, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "ortqnn", &env), "CreateEnv");
    check(FN(RegisterEpLibraryFn, RegisterExecutionProviderLibrary)(env, "QNN", wide(argv[3])),
          "RegisterExecutionProviderLibrary");
    const OrtEpDevice *device = qnn_device(env);

    for (int p = 0; p < pairs; p++) {
        const char *model = argv[first + 2 * p], *out = argv[first + 2 * p + 1];
        OrtSessionOptions *so;
        OrtSession *session;
        check(FN(CreateSessionOptionsFn, CreateSessionOptions)(&so), "CreateSessionOptions");
        add_config(so, "ep.context_enable", "1");
        add_config(so, "ep.context_file_path", out);
        add_config(so, "ep.context_embed_mode", "0");
        add_config(so, "session.disable_cpu_ep_fallback", "1");   /* the whole graph on HTP */
        if (pairs > 1) {
            add_config(so, "ep.share_ep_contexts", "1");
            if (p == pairs - 1) add_config(so, "ep.stop_share_ep_contexts", "1");
        }
        for (int k = 0; k < n_session; k++) add_config(so, session_keys[k], session_vals[k]);
        check(FN(AppendEpV2Fn, SessionOptionsAppendExecutionProvider_V2)(
                  so, env, &device, 1, ep_keys, ep_vals, (size_t)n_ep),
              "SessionOptionsAppendExecutionProvider_V2");
        DWORD started = GetTickCount();
        check(FN(CreateSessionFn, CreateSession)(env, wide(model), so, &session), model);
        printf("compiled %s in %lu ms\n", model, (unsigned long)(GetTickCount() - started));
        fflush(stdout);
        FN(ReleaseFn, ReleaseSession)(session);
        FN(ReleaseFn, ReleaseSessionOptions)(so);
    }
    FN(ReleaseFn, ReleaseEnv)(env);
    return 0;
}
