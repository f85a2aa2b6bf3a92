/* The book's C example (docs/src/embedding/c.md): a program written for Triton's in-process C API, run against the mesh's
 * libtritonserver.so. It starts a server on a model repository, runs add_sub once (INPUT0 + INPUT1,
 * INPUT0 - INPUT1), prints the outputs, then checks that bad requests get Triton's errors.
 *
 *   cc tests/capi/add_sub.c -I crates/capi/include -L target/release -ltritonserver \
 *      -Wl,-rpath,$PWD/target/release -lpthread -o add_sub
 *   ./add_sub target/models/simple
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tritonserver.h"

/* Exits with the message of a failed call. */
#define CHECK(call)                                                                  \
  do {                                                                               \
    TRITONSERVER_Error* err__ = (call);                                              \
    if (err__ != NULL) {                                                             \
      fprintf(stderr, "%s failed: %s: %s\n", #call, TRITONSERVER_ErrorCodeString(err__), \
              TRITONSERVER_ErrorMessage(err__));                                     \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

/* Expects a call to fail with `code`; prints its message. */
static void expect(const char* what, TRITONSERVER_Error* err, TRITONSERVER_Error_Code code) {
  if (err == NULL) {
    fprintf(stderr, "%s: expected an error, got success\n", what);
    exit(1);
  }
  if (TRITONSERVER_ErrorCode(err) != code) {
    fprintf(stderr, "%s: expected %d, got %s: %s\n", what, (int)code, TRITONSERVER_ErrorCodeString(err),
            TRITONSERVER_ErrorMessage(err));
    exit(1);
  }
  printf("refused %s: %s: %s\n", what, TRITONSERVER_ErrorCodeString(err), TRITONSERVER_ErrorMessage(err));
  TRITONSERVER_ErrorDelete(err);
}

/* Output buffers: plain malloc, freed when the response is deleted. */
static TRITONSERVER_Error* alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* name, size_t size,
                                    TRITONSERVER_MemoryType type, int64_t type_id, void* userp, void** buffer,
                                    void** buffer_userp, TRITONSERVER_MemoryType* actual_type, int64_t* actual_id) {
  *buffer = size == 0 ? NULL : malloc(size);
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

/* One request's answer, handed from the server's thread to main. */
struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  TRITONSERVER_InferenceResponse* response;
  int done, released;
};

static void request_released(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp) {
  struct waiter* w = userp;
  pthread_mutex_lock(&w->mu);
  w->released = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void response_complete(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  struct waiter* w = userp;
  pthread_mutex_lock(&w->mu);
  if (response != NULL) w->response = response;
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) w->done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_REPOSITORY\n", argv[0]);
    return 2;
  }
  uint32_t major, minor;
  CHECK(TRITONSERVER_ApiVersion(&major, &minor));
  if (major != TRITONSERVER_API_VERSION_MAJOR || minor < TRITONSERVER_API_VERSION_MINOR) {
    fprintf(stderr, "library API %u.%u is older than the header's\n", major, minor);
    return 1;
  }

  TRITONSERVER_ServerOptions* options;
  CHECK(TRITONSERVER_ServerOptionsNew(&options));
  CHECK(TRITONSERVER_ServerOptionsSetModelRepositoryPath(options, argv[1]));
  CHECK(TRITONSERVER_ServerOptionsSetModelControlMode(options, TRITONSERVER_MODEL_CONTROL_EXPLICIT));
  CHECK(TRITONSERVER_ServerOptionsSetStartupModel(options, "add_sub"));
  CHECK(TRITONSERVER_ServerOptionsSetStrictModelConfig(options, true));
  CHECK(TRITONSERVER_ServerOptionsSetLogInfo(options, false));
  TRITONSERVER_Server* server;
  CHECK(TRITONSERVER_ServerNew(&server, options));
  CHECK(TRITONSERVER_ServerOptionsDelete(options));

  bool ready = false;
  CHECK(TRITONSERVER_ServerModelIsReady(server, "add_sub", -1, &ready));
  printf("add_sub ready: %s\n", ready ? "yes" : "no");

  TRITONSERVER_Message* metadata;
  const char* json;
  size_t json_size;
  CHECK(TRITONSERVER_ServerModelMetadata(server, "add_sub", 1, &metadata));
  CHECK(TRITONSERVER_MessageSerializeToJson(metadata, &json, &json_size));
  printf("metadata: %.*s\n", (int)json_size, json);
  CHECK(TRITONSERVER_MessageDelete(metadata));

  TRITONSERVER_ResponseAllocator* allocator;
  CHECK(TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL));

  float in0[16], in1[16];
  for (int i = 0; i < 16; i++) {
    in0[i] = (float)i;
    in1[i] = 1.0f;
  }
  const int64_t shape[2] = {1, 16};
  struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

  TRITONSERVER_InferenceRequest* request;
  CHECK(TRITONSERVER_InferenceRequestNew(&request, server, "add_sub", -1));
  CHECK(TRITONSERVER_InferenceRequestSetId(request, "first"));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, "INPUT0", TRITONSERVER_TYPE_FP32, shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, "INPUT1", TRITONSERVER_TYPE_FP32, shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, "INPUT0", in0, sizeof in0, TRITONSERVER_MEMORY_CPU, 0));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, "INPUT1", in1, sizeof in1, TRITONSERVER_MEMORY_CPU, 0));
  CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(request, request_released, &w));
  CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(request, allocator, NULL, response_complete, &w));
  CHECK(TRITONSERVER_ServerInferAsync(server, request, NULL));

  pthread_mutex_lock(&w.mu);
  while (!w.done || !w.released) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);

  CHECK(TRITONSERVER_InferenceResponseError(w.response));
  const char* model;
  int64_t version;
  const char* id;
  CHECK(TRITONSERVER_InferenceResponseModel(w.response, &model, &version));
  CHECK(TRITONSERVER_InferenceResponseId(w.response, &id));
  uint32_t count;
  CHECK(TRITONSERVER_InferenceResponseOutputCount(w.response, &count));
  printf("response from %s version %lld, id %s, %u outputs\n", model, (long long)version, id, count);
  for (uint32_t i = 0; i < count; i++) {
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* out_shape;
    uint64_t dims;
    const void* base;
    size_t size;
    TRITONSERVER_MemoryType type;
    int64_t type_id;
    void* userp;
    CHECK(TRITONSERVER_InferenceResponseOutput(w.response, i, &name, &dtype, &out_shape, &dims, &base, &size,
                                               &type, &type_id, &userp));
    const float* v = base;
    printf("%s %s [%lld, %lld]:", name, TRITONSERVER_DataTypeString(dtype), (long long)out_shape[0],
           (long long)out_shape[1]);
    for (size_t k = 0; k < size / sizeof(float); k++) printf(" %g", v[k]);
    printf("\n");
  }
  CHECK(TRITONSERVER_InferenceResponseDelete(w.response));

  /* Bad requests get Triton's codes from TRITONSERVER_ServerInferAsync, and stay the caller's. */
  const int64_t bad_shape[2] = {1, 15};
  CHECK(TRITONSERVER_InferenceRequestRemoveAllInputs(request));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, "INPUT0", TRITONSERVER_TYPE_INT32, shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, "INPUT1", TRITONSERVER_TYPE_FP32, shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, "INPUT0", in0, sizeof in0, TRITONSERVER_MEMORY_CPU, 0));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, "INPUT1", in1, sizeof in1, TRITONSERVER_MEMORY_CPU, 0));
  expect("a wrong datatype", TRITONSERVER_ServerInferAsync(server, request, NULL), TRITONSERVER_ERROR_INVALID_ARG);
  CHECK(TRITONSERVER_InferenceRequestRemoveInput(request, "INPUT0"));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, "INPUT0", TRITONSERVER_TYPE_FP32, bad_shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, "INPUT0", in0, 15 * sizeof(float), TRITONSERVER_MEMORY_CPU, 0));
  expect("a wrong shape", TRITONSERVER_ServerInferAsync(server, request, NULL), TRITONSERVER_ERROR_INVALID_ARG);
  CHECK(TRITONSERVER_InferenceRequestRemoveInput(request, "INPUT0"));
  CHECK(TRITONSERVER_InferenceRequestAddInput(request, "INPUT0", TRITONSERVER_TYPE_FP32, shape, 2));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(request, "INPUT0", in0, 15 * sizeof(float), TRITONSERVER_MEMORY_CPU, 0));
  expect("too few bytes", TRITONSERVER_ServerInferAsync(server, request, NULL), TRITONSERVER_ERROR_INVALID_ARG);
  CHECK(TRITONSERVER_InferenceRequestDelete(request));
  expect("a deleted request", TRITONSERVER_InferenceRequestSetId(request, "again"), TRITONSERVER_ERROR_INVALID_ARG);

  TRITONSERVER_InferenceRequest* unknown;
  CHECK(TRITONSERVER_InferenceRequestNew(&unknown, server, "no_such_model", -1));
  CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(unknown, request_released, &w));
  CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(unknown, allocator, NULL, response_complete, &w));
  expect("an unknown model", TRITONSERVER_ServerInferAsync(server, unknown, NULL), TRITONSERVER_ERROR_NOT_FOUND);
  expect("an unsupported function", TRITONSERVER_ServerPollModelRepository(server), TRITONSERVER_ERROR_UNSUPPORTED);

  CHECK(TRITONSERVER_ServerStop(server));
  expect("a call after stop", TRITONSERVER_ServerInferAsync(server, unknown, NULL), TRITONSERVER_ERROR_UNAVAILABLE);
  CHECK(TRITONSERVER_InferenceRequestDelete(unknown));
  CHECK(TRITONSERVER_ResponseAllocatorDelete(allocator));
  CHECK(TRITONSERVER_ServerDelete(server));
  expect("a deleted server", TRITONSERVER_ServerIsLive(server, &ready), TRITONSERVER_ERROR_INVALID_ARG);
  printf("done\n");
  return 0;
}
