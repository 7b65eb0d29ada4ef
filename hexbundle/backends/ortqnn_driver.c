/* The ortqnn backend's compiler driver (hexbundle/backends/ortqnn.py builds it with mingw-w64's
 * x86_64-w64-mingw32-gcc and runs it under wine64, or natively on Windows x64).
 *
 * It compiles QDQ ONNX graphs into one QNN HTP context binary through ONNX Runtime's QNN
 * execution provider (onnxruntime-qnn's plugin EP), the way an EPContext model is made:
 *
 *   ortqnn_driver.exe compile ORT_DLL EP_DLL [--ep KEY=VALUE]... [--session KEY=VALUE]...
 *                     -- MODEL OUT [MODEL OUT]...
 *   ortqnn_driver.exe run ORT_DLL EP_DLL [--ep KEY=VALUE]... [--session KEY=VALUE]...
 *                     -- MODEL IN_DIR OUT_DIR
 *   ortqnn_driver.exe serve ORT_DLL EP_DLL [--ep KEY=VALUE]... [--session KEY=VALUE]...
 *                     -- MODEL
 *
 * For each MODEL a session is created with EPContext generation on (ep.context_enable=1,
 * ep.context_file_path=OUT, embed mode 0): ONNX Runtime writes OUT (the EPContext model) and
 * the EP writes the context binary beside it (OUT's stem + "_qnn.bin"). With more than one
 * MODEL, every session sets ep.share_ep_contexts=1 and the last also ep.stop_share_ep_contexts=1:
 * the graphs go into ONE context binary, their weights stored once, named after the first OUT.
 * OUT "-": the session is created without EPContext generation (what an EP option such as
 * dump_qnn_ir_dlc writes is then the only output).
 * --ep options go to the EP (backend_path, soc_model, htp_arch, ...); --session options are
 * session config entries added to every session.
 *
 * run: one session of MODEL (an EPContext model: on an x64 host QnnHtp.dll runs its context
 * binary on the HTP simulator) fed input i from IN_DIR\<i>.bin (raw bytes of the input's
 * static shape and type, in the session's input order); output i is written to OUT_DIR\<i>.bin
 * and described on stdout as "output <i> <name> <element type> <dims...>".
 *
 *   ortqnn_driver.exe serve ORT_DLL EP_DLL [--ep KEY=VALUE]... -- MODEL
 *
 * serve: the session of run, kept: each line "IN_DIR<TAB>OUT_DIR" on stdin is one run of it,
 * answered by run's lines and "done"; stdin's end ends it (doit verify's simulated graphs).
 *
 * ONNX Runtime's C API is reached through OrtGetApiBase() of ORT_DLL (loaded at run time, so
 * the driver builds without ONNX Runtime present) and its OrtApi table of function pointers.
 * Only the entries used here are declared: the table only ever grows at its end, so their
 * positions (ORT_SLOT_*) hold for every ONNX Runtime from API version ORT_API_VERSION on.
 * Exit status: 0 done, 2 ONNX Runtime refused (its message on stderr), 1 bad usage.
 */
#include <stdint.h>
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
typedef struct OrtValue OrtValue;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtAllocator OrtAllocator;

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
    ORT_SLOT_Run = 9,
    ORT_SLOT_SessionGetInputCount = 30,
    ORT_SLOT_SessionGetOutputCount = 31,
    ORT_SLOT_SessionGetInputTypeInfo = 33,
    ORT_SLOT_SessionGetInputName = 36,
    ORT_SLOT_SessionGetOutputName = 37,
    ORT_SLOT_CreateTensorWithDataAsOrtValue = 49,
    ORT_SLOT_GetTensorMutableData = 51,
    ORT_SLOT_CastTypeInfoToTensorInfo = 55,
    ORT_SLOT_GetTensorElementType = 60,
    ORT_SLOT_GetDimensionsCount = 61,
    ORT_SLOT_GetDimensions = 62,
    ORT_SLOT_GetTensorShapeElementCount = 64,
    ORT_SLOT_GetTensorTypeAndShape = 65,
    ORT_SLOT_CreateCpuMemoryInfo = 69,
    ORT_SLOT_GetAllocatorWithDefaultOptions = 78,
    ORT_SLOT_ReleaseMemoryInfo = 94,
    ORT_SLOT_ReleaseValue = 96,
    ORT_SLOT_ReleaseTypeInfo = 98,
    ORT_SLOT_ReleaseTensorTypeAndShapeInfo = 99,
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
typedef OrtStatus *(*RunFn)(OrtSession *, const void *, const char *const *,
                            const OrtValue *const *, size_t, const char *const *, size_t,
                            OrtValue **);
typedef OrtStatus *(*CountFn)(const OrtSession *, size_t *);
typedef OrtStatus *(*TypeInfoFn)(const OrtSession *, size_t, OrtTypeInfo **);
typedef OrtStatus *(*NameFn)(const OrtSession *, size_t, OrtAllocator *, char **);
typedef OrtStatus *(*CreateTensorFn)(const OrtMemoryInfo *, void *, size_t, const int64_t *,
                                     size_t, int, OrtValue **);
typedef OrtStatus *(*TensorDataFn)(OrtValue *, void **);
typedef OrtStatus *(*CastTypeInfoFn)(const OrtTypeInfo *, const OrtTensorTypeAndShapeInfo **);
typedef OrtStatus *(*ElementTypeFn)(const OrtTensorTypeAndShapeInfo *, int *);
typedef OrtStatus *(*DimsCountFn)(const OrtTensorTypeAndShapeInfo *, size_t *);
typedef OrtStatus *(*DimsFn)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t);
typedef OrtStatus *(*ElementCountFn)(const OrtTensorTypeAndShapeInfo *, size_t *);
typedef OrtStatus *(*ValueShapeFn)(const OrtValue *, OrtTensorTypeAndShapeInfo **);
typedef OrtStatus *(*CpuMemoryInfoFn)(int, int, OrtMemoryInfo **);
typedef OrtStatus *(*DefaultAllocatorFn)(OrtAllocator **);

#define MAX_OPTIONS 64
#define MAX_TENSORS 256
#define MAX_DIMS 8

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
                    "[--session K=V]... -- MODEL OUT [MODEL OUT]...\n"
                    "       ortqnn_driver.exe run ORT_DLL EP_DLL [--ep K=V]... "
                    "[--session K=V]... -- MODEL IN_DIR OUT_DIR\n"
                    "       ortqnn_driver.exe serve ORT_DLL EP_DLL [--ep K=V]... "
                    "[--session K=V]... -- MODEL\n");
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

/* Bytes of one element of ONNX element type `type` (ONNXTensorElementDataType); 0: unsupported. */
static size_t element_size(int type) {
    switch (type) {
    case 1: case 6: case 12: return 4;             /* float, int32, uint32 */
    case 2: case 3: case 9: return 1;              /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2;    /* uint16, int16, float16, bfloat16 */
    case 7: case 11: case 13: return 8;            /* int64, double, uint64 */
    default: return 0;
    }
}

static void *read_file(const char *path, size_t expected) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "ortqnn_driver: cannot open %s\n", path); exit(2); }
    void *data = malloc(expected ? expected : 1);
    size_t got = fread(data, 1, expected, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != expected || extra) {
        fprintf(stderr, "ortqnn_driver: %s: not %zu bytes\n", path, expected);
        exit(2);
    }
    return data;
}

/* The session of MODEL (for run and serve). */
static OrtSession *open_session(OrtEnv *env, OrtSessionOptions *so, const char *model) {
    OrtSession *session;
    check(FN(CreateSessionFn, CreateSession)(env, wide(model), so, &session), model);
    return session;
}

/* One inference of `session`: input i from IN_DIR\<i>.bin, output i to OUT_DIR\<i>.bin and
 * described on stdout ("output <i> <name> <element type> <dims...>"). */
static int run_once(OrtSession *session, const char *model, const char *in_dir,
                    const char *out_dir) {
    OrtMemoryInfo *cpu;
    OrtAllocator *allocator;
    size_t n_in, n_out;
    char *in_names[MAX_TENSORS], *out_names[MAX_TENSORS], path[4096];
    void *in_data[MAX_TENSORS];
    OrtValue *inputs[MAX_TENSORS], *outputs[MAX_TENSORS];
    check(FN(CpuMemoryInfoFn, CreateCpuMemoryInfo)(0, 0, &cpu), "CreateCpuMemoryInfo");
    check(FN(DefaultAllocatorFn, GetAllocatorWithDefaultOptions)(&allocator), "allocator");
    check(FN(CountFn, SessionGetInputCount)(session, &n_in), "SessionGetInputCount");
    check(FN(CountFn, SessionGetOutputCount)(session, &n_out), "SessionGetOutputCount");
    if (n_in > MAX_TENSORS || n_out > MAX_TENSORS) {
        fprintf(stderr, "ortqnn_driver: more than %d inputs or outputs\n", MAX_TENSORS);
        return 2;
    }
    for (size_t i = 0; i < n_in; i++) {
        OrtTypeInfo *info;
        const OrtTensorTypeAndShapeInfo *tensor;
        int type;
        size_t n_dims, count;
        int64_t dims[MAX_DIMS];
        check(FN(NameFn, SessionGetInputName)(session, i, allocator, &in_names[i]), "input name");
        check(FN(TypeInfoFn, SessionGetInputTypeInfo)(session, i, &info), "input type");
        check(FN(CastTypeInfoFn, CastTypeInfoToTensorInfo)(info, &tensor), "input tensor");
        check(FN(ElementTypeFn, GetTensorElementType)(tensor, &type), "input element type");
        check(FN(DimsCountFn, GetDimensionsCount)(tensor, &n_dims), "input rank");
        if (n_dims > MAX_DIMS || !element_size(type)) {
            fprintf(stderr, "ortqnn_driver: input %s: rank %zu, type %d not supported\n",
                    in_names[i], n_dims, type);
            return 2;
        }
        check(FN(DimsFn, GetDimensions)(tensor, dims, n_dims), "input dims");
        check(FN(ElementCountFn, GetTensorShapeElementCount)(tensor, &count), "input size");
        snprintf(path, sizeof path, "%s\\%zu.bin", in_dir, i);
        size_t bytes = count * element_size(type);
        in_data[i] = read_file(path, bytes);
        check(FN(CreateTensorFn, CreateTensorWithDataAsOrtValue)(cpu, in_data[i], bytes, dims,
                                                                 n_dims, type, &inputs[i]),
              in_names[i]);
        FN(ReleaseFn, ReleaseTypeInfo)(info);
    }
    for (size_t i = 0; i < n_out; i++) {
        check(FN(NameFn, SessionGetOutputName)(session, i, allocator, &out_names[i]), "output name");
        outputs[i] = NULL;
    }
    DWORD started = GetTickCount();
    check(FN(RunFn, Run)(session, NULL, (const char *const *)in_names,
                         (const OrtValue *const *)inputs, n_in,
                         (const char *const *)out_names, n_out, outputs), "Run");
    printf("ran %s in %lu ms\n", model, (unsigned long)(GetTickCount() - started));
    for (size_t i = 0; i < n_out; i++) {
        OrtTensorTypeAndShapeInfo *shape;
        int type;
        size_t n_dims, count;
        int64_t dims[MAX_DIMS];
        void *data;
        check(FN(ValueShapeFn, GetTensorTypeAndShape)(outputs[i], &shape), "output shape");
        check(FN(ElementTypeFn, GetTensorElementType)(shape, &type), "output element type");
        check(FN(DimsCountFn, GetDimensionsCount)(shape, &n_dims), "output rank");
        if (n_dims > MAX_DIMS || !element_size(type)) {
            fprintf(stderr, "ortqnn_driver: output %s: rank %zu, type %d not supported\n",
                    out_names[i], n_dims, type);
            return 2;
        }
        check(FN(DimsFn, GetDimensions)(shape, dims, n_dims), "output dims");
        check(FN(ElementCountFn, GetTensorShapeElementCount)(shape, &count), "output size");
        check(FN(TensorDataFn, GetTensorMutableData)(outputs[i], &data), "output data");
        snprintf(path, sizeof path, "%s\\%zu.bin", out_dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(data, element_size(type), count, f) != count || fclose(f) != 0) {
            fprintf(stderr, "ortqnn_driver: cannot write %s\n", path);
            return 2;
        }
        printf("output %zu %s %d", i, out_names[i], type);
        for (size_t d = 0; d < n_dims; d++) printf(" %lld", (long long)dims[d]);
        printf("\n");
        FN(ReleaseFn, ReleaseTensorTypeAndShapeInfo)(shape);
        FN(ReleaseFn, ReleaseValue)(outputs[i]);
    }
    /* a serving driver runs many times: give back what each run took */
    for (size_t i = 0; i < n_in; i++) {
        FN(ReleaseFn, ReleaseValue)(inputs[i]);
        free(in_data[i]);
    }
    FN(ReleaseFn, ReleaseMemoryInfo)(cpu);
    return 0;
}

/* serve: requests on stdin, one a line, "IN_DIR<TAB>OUT_DIR", each answered by run_once's
 * lines and "done" (flushed), until stdin ends: a host runs a sequence (prefill chunks, then
 * one token at a time, its KV cache fed back) without a Wine start and a session per step. */
static int serve(OrtSession *session, const char *model) {
    char line[8192];
    printf("serving %s\n", model);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        char *tab = strchr(line, '\t');
        if (!tab) {
            fprintf(stderr, "ortqnn_driver: serve: a request is IN_DIR<TAB>OUT_DIR, not '%s'\n",
                    line);
            return 1;
        }
        *tab = 0;
        int status = run_once(session, model, line, tab + 1);
        if (status) return status;
        printf("done\n");
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *ep_keys[MAX_OPTIONS], *ep_vals[MAX_OPTIONS];
    const char *session_keys[MAX_OPTIONS], *session_vals[MAX_OPTIONS];
    int n_ep = 0, n_session = 0, i;
    if (argc < 4 || (strcmp(argv[1], "compile") != 0 && strcmp(argv[1], "run") != 0
                     && strcmp(argv[1], "serve") != 0))
        return usage();
    int serving = !strcmp(argv[1], "serve");
    int running = serving || !strcmp(argv[1], "run");
    for (i = 4; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--ep") ? !split_option(argv[i + 1], ep_keys, ep_vals, &n_ep)
            : !strcmp(argv[i], "--session")
                ? !split_option(argv[i + 1], session_keys, session_vals, &n_session)
                : 1)
            return usage();
    }
    int first = i + 1, pairs = (argc - first) / 2;
    if (running ? i >= argc || argc - first != (serving ? 1 : 3)
                : i >= argc || pairs < 1 || (argc - first) % 2)
        return usage();

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

    if (running) {
        OrtSessionOptions *so;
        check(FN(CreateSessionOptionsFn, CreateSessionOptions)(&so), "CreateSessionOptions");
        add_config(so, "session.disable_cpu_ep_fallback", "1");
        for (int k = 0; k < n_session; k++) add_config(so, session_keys[k], session_vals[k]);
        check(FN(AppendEpV2Fn, SessionOptionsAppendExecutionProvider_V2)(
                  so, env, &device, 1, ep_keys, ep_vals, (size_t)n_ep),
              "SessionOptionsAppendExecutionProvider_V2");
        OrtSession *session = open_session(env, so, argv[first]);
        int status = serving ? serve(session, argv[first])
                             : run_once(session, argv[first], argv[first + 1], argv[first + 2]);
        FN(ReleaseFn, ReleaseSession)(session);
        FN(ReleaseFn, ReleaseSessionOptions)(so);
        FN(ReleaseFn, ReleaseEnv)(env);
        return status;
    }

    for (int p = 0; p < pairs; p++) {
        const char *model = argv[first + 2 * p], *out = argv[first + 2 * p + 1];
        OrtSessionOptions *so;
        OrtSession *session;
        check(FN(CreateSessionOptionsFn, CreateSessionOptions)(&so), "CreateSessionOptions");
        if (strcmp(out, "-") != 0) {
            add_config(so, "ep.context_enable", "1");
            add_config(so, "ep.context_file_path", out);
            add_config(so, "ep.context_embed_mode", "0");
        }
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
