/* Load the x64 Genie.dll of onnxruntime-qnn 2.7.0 and run a GenieDialog from a bundle's
   genie_config.json: how far it gets under Wine on QAIRT's x64 HTP simulator. */
#include <stdio.h>
#include <stdlib.h>
#include <windows.h>
typedef int (*cfg_from_json_t)(const char*, void**);
typedef int (*dialog_create_t)(void*, void**);
typedef void (*cb_t)(const char*, int, const void*);
typedef int (*dialog_query_t)(void*, const char*, int, cb_t, const void*);
typedef int (*log_create_t)(void*, void (*)(void*, const char*, int, unsigned long long, va_list), int, void**);
typedef int (*cfg_bind_log_t)(void*, void*);
static void on_token(const char* r, int code, const void* u) { printf("[token code=%d] %s\n", code, r ? r : "(null)"); fflush(stdout); }
static void on_log(void* h, const char* fmt, int level, unsigned long long ts, va_list args) {
  fprintf(stderr, "[genie log %d] ", level); vfprintf(stderr, fmt, args); fprintf(stderr, "\n"); fflush(stderr); }
int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: genie_try CONFIG PROMPT\n"); return 2; }
  HMODULE g = LoadLibraryA("Genie.dll");
  if (!g) { fprintf(stderr, "LoadLibrary(Genie.dll) failed: %lu\n", GetLastError()); return 3; }
  printf("Genie.dll loaded\n"); fflush(stdout);
  FILE* f = fopen(argv[1], "rb"); if (!f) { perror(argv[1]); return 2; }
  fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
  char* json = calloc(n + 1, 1); fread(json, 1, n, f); fclose(f);
  cfg_from_json_t from_json = (cfg_from_json_t)GetProcAddress(g, "GenieDialogConfig_createFromJson");
  dialog_create_t create = (dialog_create_t)GetProcAddress(g, "GenieDialog_create");
  dialog_query_t query = (dialog_query_t)GetProcAddress(g, "GenieDialog_query");
  log_create_t log_create = (log_create_t)GetProcAddress(g, "GenieLog_create");
  cfg_bind_log_t bind_log = (cfg_bind_log_t)GetProcAddress(g, "GenieDialogConfig_bindLogger");
  printf("symbols: fromJson %p create %p query %p logCreate %p bindLogger %p\n", (void*)from_json, (void*)create, (void*)query, (void*)log_create, (void*)bind_log); fflush(stdout);
  void* cfg = NULL; int rc = from_json(json, &cfg);
  printf("GenieDialogConfig_createFromJson: %d\n", rc); fflush(stdout);
  if (rc) return 4;
  if (log_create && bind_log) {
    void* logh = NULL; int lr = log_create(NULL, on_log, 4 /* verbose */, &logh);
    printf("GenieLog_create: %d\n", lr);
    if (!lr) printf("GenieDialogConfig_bindLogger: %d\n", bind_log(cfg, logh));
    fflush(stdout);
  }
  void* dialog = NULL; rc = create(cfg, &dialog);
  printf("GenieDialog_create: %d\n", rc); fflush(stdout);
  if (rc) return 5;
  rc = query(dialog, argv[2], 0 /* GENIE_DIALOG_SENTENCE_COMPLETE */, on_token, NULL);
  printf("GenieDialog_query: %d\n", rc); fflush(stdout);
  return rc ? 6 : 0;
}
