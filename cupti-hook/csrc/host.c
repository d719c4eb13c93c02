/* Loads the hook the way CUDA does for CUDA_INJECTION64_PATH (dlopen, then
 * InitializeInjection), then plays the engine: drives the stand-in libcupti and exits 0.
 * usage: cupti_host HOOK.so [emit N MEMCPY GRAPH MARKERS]... [flush]
 * Prints one line per step so tests can follow it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s HOOK.so [emit N MEMCPY GRAPH MARKERS]... [flush]\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  void *hook = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!hook) {
    printf("hook dlopen failed: %s\n", dlerror());
    return 3;
  }
  int (*init)(void) = (int (*)(void))dlsym(hook, "InitializeInjection");
  if (!init) {
    printf("hook lacks InitializeInjection\n");
    return 4;
  }
  printf("init %d\n", init());
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "emit") == 0 && i + 4 < argc) {
      const char *lib = getenv("TOKENSCOPE_CUPTI_LIB");
      void *standin = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
      int (*emit)(int, int, int, int) =
          standin ? (int (*)(int, int, int, int))dlsym(standin, "standin_emit") : NULL;
      int n = atoi(argv[i + 1]), m = atoi(argv[i + 2]), g = atoi(argv[i + 3]),
          k = atoi(argv[i + 4]);
      i += 4;
      if (!emit) {
        printf("emitted none (stand-in not loaded)\n");
        continue;
      }
      printf("emitted %d\n", emit(n, m, g, k));
    } else if (strcmp(argv[i], "flush") == 0) {
      int (*flush)(void) = (int (*)(void))dlsym(hook, "tokenscope_cupti_flush");
      printf("flushed %d\n", flush ? flush() : -1);
    } else {
      printf("unknown step %s\n", argv[i]);
      return 2;
    }
  }
  printf("host done\n");
  return 0;
}
