/* In-process latency through Triton's C API (the mesh's libtritonserver.so, or Triton's own): one
 * request at a time on an FP32 model with one input and one output, the request reused after each
 * release, as an embedding application would. Prints p50/p99/mean in microseconds, and the resident
 * memory and the heap in use (glibc's mallinfo2) after the warm-up and at the end.
 *
 *   capi_latency REPOSITORY MODEL INPUT OUTPUT DIM ITERATIONS [BACKEND_DIR]
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tritonserver.h"

#define CHECK(call)                                                                            \
  do {                                                                                         \
    TRITONSERVER_Error* err__ = (call);                                                        \
    if (err__ != NULL) {                                                                       \
      fprintf(stderr, "%s: %s\n", #call, TRITONSERVER_ErrorMessage(err__));                    \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int finals, releases;
static char out_buf[1 << 16];

static TRITONSERVER_Error* alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* n, size_t size,
                                    TRITONSERVER_MemoryType t, int64_t id, void* u, void** buffer, void** bu,
                                    TRITONSERVER_MemoryType* at, int64_t* aid) {
  *buffer = size <= sizeof out_buf ? out_buf : malloc(size); /* one output, reused */
  *bu = NULL;
  *at = TRITONSERVER_MEMORY_CPU;
  *aid = 0;
  return NULL;
}

static TRITONSERVER_Error* release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer, void* bu, size_t size,
                                      TRITONSERVER_MemoryType t, int64_t id) {
  if (buffer != out_buf) free(buffer);
  return NULL;
}

static void released(TRITONSERVER_InferenceRequest* r, const uint32_t flags, void* u) {
  pthread_mutex_lock(&mu);
  releases++;
  pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
}

static void complete(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* u) {
  if (response != NULL) {
    TRITONSERVER_Error* e = TRITONSERVER_InferenceResponseError(response);
    if (e != NULL) {
      fprintf(stderr, "response error: %s\n", TRITONSERVER_ErrorMessage(e));
      exit(1);
    }
    TRITONSERVER_InferenceResponseDelete(response);
  }
  pthread_mutex_lock(&mu);
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) finals++;
  pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static long rss_kib(void) {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f != NULL) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s REPOSITORY MODEL INPUT OUTPUT DIM ITERATIONS [BACKEND_DIR]\n", argv[0]);
    return 2;
  }
  const char *model = argv[2], *input = argv[3], *output = argv[4];
  int dim = atoi(argv[5]);
  long iterations = atol(argv[6]);
  TRITONSERVER_ServerOptions* options;
  CHECK(TRITONSERVER_ServerOptionsNew(&options));
  CHECK(TRITONSERVER_ServerOptionsSetModelRepositoryPath(options, argv[1]));
  CHECK(TRITONSERVER_ServerOptionsSetModelControlMode(options, TRITONSERVER_MODEL_CONTROL_EXPLICIT));
  CHECK(TRITONSERVER_ServerOptionsSetStartupModel(options, model));
  CHECK(TRITONSERVER_ServerOptionsSetStrictModelConfig(options, false));
  CHECK(TRITONSERVER_ServerOptionsSetLogInfo(options, false));
  if (argc > 7) CHECK(TRITONSERVER_ServerOptionsSetBackendDirectory(options, argv[7]));
  TRITONSERVER_Server* server;
  CHECK(TRITONSERVER_ServerNew(&server, options));
  CHECK(TRITONSERVER_ServerOptionsDelete(options));

  TRITONSERVER_ResponseAllocator* allocator;
  CHECK(TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL));
  float* x = calloc(dim, sizeof(float));
  for (int i = 0; i < dim; i++) x[i] = (float)i / dim;
  const int64_t shape[2] = {1, dim};
  TRITONSERVER_InferenceRequest* request;
  CHECK(TRITONSERVER_InferenceRequestNew(&request, server, model, -1));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, input, TRITONSERVER_TYPE_FP32, shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, input, x, dim * sizeof(float), TRITONSERVER_MEMORY_CPU, 0));
  CHECK(TRITONSERVER_InferenceRequestAddRequestedOutput(request, output));
  CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(request, released, NULL));
  CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(request, allocator, NULL, complete, NULL));

  long warmup = iterations / 10 < 1000 ? iterations / 10 : 1000;
  double* samples = malloc(sizeof(double) * iterations);
  memset(samples, 0xff, sizeof(double) * iterations); /* touched now: not counted as growth later */
  long rss_warm = 0;
  size_t heap_warm = 0;
  for (long i = -warmup; i < iterations; i++) {
    if (i == 0) {
      rss_warm = rss_kib();
      heap_warm = mallinfo2().uordblks;
    }
    double t0 = now_us();
    CHECK(TRITONSERVER_ServerInferAsync(server, request, NULL));
    pthread_mutex_lock(&mu);
    long target = i + warmup + 1;
    while (finals < target || releases < target) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    if (i >= 0) samples[i] = now_us() - t0;
  }
  long rss_end = rss_kib();
  size_t heap_end = mallinfo2().uordblks;
  double sum = 0;
  for (long i = 0; i < iterations; i++) sum += samples[i];
  qsort(samples, iterations, sizeof(double), by_value);
  printf("{\"p50_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"iterations\": %ld, \"rss_kib_after_warmup\": %ld, "
         "\"rss_kib_end\": %ld, \"heap_bytes_in_use_after_warmup\": %zu, \"heap_bytes_in_use_end\": %zu}\n",
         samples[iterations / 2], samples[iterations * 99 / 100], sum / iterations, iterations, rss_warm, rss_end,
         heap_warm, heap_end);
  CHECK(TRITONSERVER_InferenceRequestDelete(request));
  CHECK(TRITONSERVER_ResponseAllocatorDelete(allocator));
  CHECK(TRITONSERVER_ServerDelete(server));
  return 0;
}
