/* Decoupled answers and many requests in flight through the C API: repeat_py (a decoupled Python
 * model) answers once per element of IN, then sends the final flag alone. 64 requests go out at once,
 * each reused for a second round after its release; every answer, final flag and release is counted.
 *
 *   stream MODEL_REPOSITORY PYTHON      (PYTHON: the interpreter Python models run on)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tritonserver.h"

#define CHECK(call)                                                                                \
  do {                                                                                             \
    TRITONSERVER_Error* err__ = (call);                                                            \
    if (err__ != NULL) {                                                                           \
      fprintf(stderr, "%s failed: %s: %s\n", #call, TRITONSERVER_ErrorCodeString(err__),            \
              TRITONSERVER_ErrorMessage(err__));                                                   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define REQUESTS 64
#define ELEMENTS 3

static TRITONSERVER_Error* alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* name, size_t size,
                                    TRITONSERVER_MemoryType type, int64_t type_id, void* userp, void** buffer,
                                    void** buffer_userp, TRITONSERVER_MemoryType* actual_type, int64_t* actual_id) {
  *buffer = malloc(size > 0 ? size : 1);
  *buffer_userp = NULL;
  *actual_type = TRITONSERVER_MEMORY_CPU;
  *actual_id = 0;
  return NULL;
}

static TRITONSERVER_Error* release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer, void* buffer_userp,
                                      size_t size, TRITONSERVER_MemoryType type, int64_t type_id) {
  free(buffer);
  return NULL;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

struct slot {
  int32_t in[ELEMENTS];
  int answers, finals, null_finals, releases, wrong;
};

static void released(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp) {
  struct slot* s = userp;
  pthread_mutex_lock(&mu);
  if (flags == TRITONSERVER_REQUEST_RELEASE_ALL) s->releases++;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void answered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  struct slot* s = userp;
  int wrong = 0;
  if (response != NULL) {
    if (TRITONSERVER_InferenceResponseError(response) != NULL) wrong = 1;
    uint32_t count = 0;
    TRITONSERVER_InferenceResponseOutputCount(response, &count);
    int32_t out = -1;
    uint32_t idx = 99;
    for (uint32_t i = 0; i < count; i++) {
      const char* name;
      TRITONSERVER_DataType dtype;
      const int64_t* shape;
      uint64_t dims;
      const void* base;
      size_t size;
      TRITONSERVER_MemoryType type;
      int64_t type_id;
      void* bu;
      CHECK(TRITONSERVER_InferenceResponseOutput(response, i, &name, &dtype, &shape, &dims, &base, &size, &type,
                                                 &type_id, &bu));
      if (strcmp(name, "OUT") == 0) out = *(const int32_t*)base;
      if (strcmp(name, "IDX") == 0) idx = *(const uint32_t*)base;
    }
    if (idx >= ELEMENTS || out != s->in[idx]) wrong = 1;
    CHECK(TRITONSERVER_InferenceResponseDelete(response));
  }
  pthread_mutex_lock(&mu);
  if (response != NULL) s->answers++;
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) {
    s->finals++;
    if (response == NULL) s->null_finals++;
  }
  s->wrong += wrong;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL_REPOSITORY PYTHON\n", argv[0]);
    return 2;
  }
  TRITONSERVER_ServerOptions* options;
  CHECK(TRITONSERVER_ServerOptionsNew(&options));
  CHECK(TRITONSERVER_ServerOptionsSetModelRepositoryPath(options, argv[1]));
  CHECK(TRITONSERVER_ServerOptionsSetModelControlMode(options, TRITONSERVER_MODEL_CONTROL_EXPLICIT));
  CHECK(TRITONSERVER_ServerOptionsSetBackendConfig(options, "python", "interpreter", argv[2]));
  CHECK(TRITONSERVER_ServerOptionsSetLogInfo(options, false));
  TRITONSERVER_Server* server;
  CHECK(TRITONSERVER_ServerNew(&server, options));
  CHECK(TRITONSERVER_ServerOptionsDelete(options));
  CHECK(TRITONSERVER_ServerLoadModel(server, "repeat_py"));
  uint32_t txn = 0;
  CHECK(TRITONSERVER_ServerModelTransactionProperties(server, "repeat_py", -1, &txn, NULL));
  printf("decoupled: %s\n", (txn & TRITONSERVER_TXN_DECOUPLED) ? "yes" : "no");

  TRITONSERVER_ResponseAllocator* allocator;
  CHECK(TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL));
  static struct slot slots[REQUESTS];
  TRITONSERVER_InferenceRequest* requests[REQUESTS];
  const int64_t shape[1] = {ELEMENTS};
  for (int r = 0; r < REQUESTS; r++) {
    for (int e = 0; e < ELEMENTS; e++) slots[r].in[e] = r * 10 + e;
    CHECK(TRITONSERVER_InferenceRequestNew(&requests[r], server, "repeat_py", -1));
    CHECK(TRITONSERVER_InferenceRequestAddInput(requests[r], "IN", TRITONSERVER_TYPE_INT32, shape, 1));
    CHECK(TRITONSERVER_InferenceRequestAppendInputData(requests[r], "IN", slots[r].in, sizeof slots[r].in,
                                                       TRITONSERVER_MEMORY_CPU, 0));
    CHECK(TRITONSERVER_InferenceRequestSetStringParameter(requests[r], "mode", r % 2 ? "thread" : "inline"));
    CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(requests[r], released, &slots[r]));
    CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(requests[r], allocator, NULL, answered, &slots[r]));
  }
  for (int round = 1; round <= 2; round++) {
    for (int r = 0; r < REQUESTS; r++) CHECK(TRITONSERVER_ServerInferAsync(server, requests[r], NULL));
    pthread_mutex_lock(&mu);
    for (int r = 0; r < REQUESTS; r++)
      while (slots[r].finals < round || slots[r].releases < round) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
  }
  int answers = 0, finals = 0, null_finals = 0, releases = 0, wrong = 0;
  for (int r = 0; r < REQUESTS; r++) {
    answers += slots[r].answers;
    finals += slots[r].finals;
    null_finals += slots[r].null_finals;
    releases += slots[r].releases;
    wrong += slots[r].wrong;
    CHECK(TRITONSERVER_InferenceRequestDelete(requests[r]));
  }
  printf("answers %d, finals %d (%d without a response), releases %d, wrong %d\n", answers, finals, null_finals,
         releases, wrong);
  CHECK(TRITONSERVER_ResponseAllocatorDelete(allocator));
  CHECK(TRITONSERVER_ServerDelete(server));
  return 0;
}
