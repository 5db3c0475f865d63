/* A PS task and a worker task in C, over starwire on loopback.
 *
 * The PS owns N_VARS embedding rows (float32[DIM]) and serves pulls and pushes through
 * C callbacks (a push adds the gradient into the row); it also publishes N_KEYS tensors
 * into its rendezvous for step 1. The worker (its own runtime, as in another process)
 * receives all the keys with one fused recv, pulls the rows into memory from its own
 * allocator hook, pushes a gradient for each, and pulls again to see the update.
 *
 * Build (from the repository root, after `cargo build -p starwire-ffi`):
 *   cc -Wall -Wextra -O2 -Iffi/include ffi/examples/ps_worker.c \
 *      target/debug/libstarwire_ffi.a -lpthread -ldl -lm -o ps_worker
 * Exits 0 when every check passed. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starwire.h"

#define N_VARS 64
#define DIM 16
#define N_KEYS 100
#define F32 10 /* wire dtype code of float32 */

#define CHECK(call)                                                                   \
  do {                                                                                \
    sw_result r_ = (call);                                                            \
    if (r_ != SW_OK) {                                                                \
      fprintf(stderr, "%s:%d: %s failed (%u): %s\n", __FILE__, __LINE__, #call,       \
              (unsigned)r_, sw_last_error());                                         \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);             \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

/* ----- the PS: a table of rows behind a lock ----- */

struct table {
  pthread_mutex_t lock;
  float rows[N_VARS][DIM];
  uint64_t pushes;
};

static void ps_pull(void *user, const uint64_t *ids, size_t n, sw_tensor **out,
                    uint32_t *statuses) {
  struct table *t = user;
  const uint64_t dims[1] = {DIM};
  pthread_mutex_lock(&t->lock);
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= N_VARS) {
      statuses[i] = 1; /* NOT_FOUND */
      continue;
    }
    /* A copy of the row; its ownership passes to starwire. */
    if (sw_tensor_new(F32, dims, 1, t->rows[ids[i]], sizeof t->rows[0], &out[i]) != SW_OK)
      statuses[i] = 8; /* INTERNAL */
  }
  pthread_mutex_unlock(&t->lock);
}

static void ps_push(void *user, const uint64_t *ids, const sw_tensor *const *tensors,
                    size_t n, uint32_t *statuses) {
  struct table *t = user;
  pthread_mutex_lock(&t->lock);
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= N_VARS || sw_tensor_byte_len(tensors[i]) != sizeof t->rows[0]) {
      statuses[i] = 7; /* INVALID_ARGUMENT */
      continue;
    }
    const float *g = sw_tensor_data(tensors[i]);
    for (int k = 0; k < DIM; k++) t->rows[ids[i]][k] += g[k];
    t->pushes++;
  }
  pthread_mutex_unlock(&t->lock);
}

/* ----- the worker's allocator hook: counts, and checks every release ----- */

struct arena {
  pthread_mutex_t lock;
  uint64_t allocated, released;
};

static void *worker_alloc(void *user, uint8_t dtype, const uint64_t *dims, uint32_t rank,
                          uint64_t byte_len) {
  (void)dtype, (void)dims, (void)rank;
  struct arena *a = user;
  void *p = aligned_alloc(64, (byte_len + 63) / 64 * 64);
  pthread_mutex_lock(&a->lock);
  if (p) a->allocated++;
  pthread_mutex_unlock(&a->lock);
  return p;
}

static void worker_release(void *user, void *data, uint64_t byte_len) {
  (void)byte_len;
  struct arena *a = user;
  free(data);
  pthread_mutex_lock(&a->lock);
  a->released++;
  pthread_mutex_unlock(&a->lock);
}

int main(void) {
  printf("starwire %s\n", starwire_version());

  /* PS: listens on a free loopback port, one loop, handlers inline. */
  static struct table table = {.lock = PTHREAD_MUTEX_INITIALIZER};
  for (int v = 0; v < N_VARS; v++)
    for (int k = 0; k < DIM; k++) table.rows[v][k] = (float)v + (float)k / 100.0f;
  sw_service service = {.user_data = &table, .pull = ps_pull, .push = ps_push};
  const char *names[] = {"NETWORK_PS_CORE_NUMBER"};
  const char *values[] = {"1"};
  sw_runtime_options ps_opts = {
      .job = "ps", .task_index = 0, .setting_names = names, .setting_values = values,
      .settings = 1, .use_env = true, .listen = "127.0.0.1:0", .service = &service};
  sw_runtime *ps = NULL;
  CHECK(sw_runtime_new(&ps_opts, &ps));
  char peer[32];
  snprintf(peer, sizeof peer, "127.0.0.1:%u", (unsigned)sw_runtime_port(ps));
  printf("PS listening on %s\n", peer);

  /* The PS publishes N_KEYS tensors for step 1: key "grad/i" holds int64 [i, i*i]. */
  for (int i = 0; i < N_KEYS; i++) {
    char key[32];
    int len = snprintf(key, sizeof key, "grad/%d", i);
    int64_t v[2] = {i, (int64_t)i * i};
    const uint64_t dims[1] = {2};
    sw_tensor *t = NULL;
    CHECK(sw_tensor_new(12 /* i64 */, dims, 1, v, sizeof v, &t));
    CHECK(sw_runtime_publish(ps, (const uint8_t *)key, (size_t)len, t));
    sw_tensor_free(t);
  }

  /* Worker: a client-only runtime with its own allocator hook. */
  static struct arena arena = {.lock = PTHREAD_MUTEX_INITIALIZER};
  sw_allocator alloc = {.user_data = &arena, .allocate = worker_alloc,
                        .release = worker_release};
  sw_runtime_options w_opts = {.job = "worker", .task_index = 0, .use_env = true,
                               .setting_names = NULL, .setting_values = NULL, .settings = 0,
                               .allocator = &alloc};
  sw_runtime *worker = NULL;
  CHECK(sw_runtime_new(&w_opts, &worker));
  sw_client *client = NULL;
  CHECK(sw_client_new(worker, 64, &client));

  uint64_t tag;
  sw_reply *reply = NULL;
  CHECK(sw_client_ping(client, peer, 32, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  printf("ping: %.1f us\n", sw_reply_rtt_us(reply));
  sw_reply_free(reply);

  /* One fused recv of all N_KEYS keys. */
  char keybuf[N_KEYS][32];
  const uint8_t *keys[N_KEYS];
  size_t key_lens[N_KEYS];
  for (int i = 0; i < N_KEYS; i++) {
    key_lens[i] = (size_t)snprintf(keybuf[i], sizeof keybuf[i], "grad/%d", i);
    keys[i] = (const uint8_t *)keybuf[i];
  }
  CHECK(sw_client_recv_many(client, peer, 1, keys, key_lens, N_KEYS, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  EXPECT(sw_reply_count(reply) == N_KEYS);
  for (size_t i = 0; i < N_KEYS; i++) {
    const sw_tensor *t = sw_reply_tensor(reply, i);
    EXPECT(sw_reply_status(reply, i) == 0 && t != NULL);
    const int64_t *v = sw_tensor_data(t);
    EXPECT(sw_tensor_dtype(t) == 12 && sw_tensor_rank(t) == 1 && sw_tensor_dims(t)[0] == 2);
    EXPECT(v[0] == (int64_t)i && v[1] == (int64_t)(i * i));
  }
  printf("fused recv: %zu tensors in one request\n", sw_reply_count(reply));
  sw_reply_free(reply);

  /* Pull every row (into the worker's allocator), then push a gradient of 1.0 for each. */
  uint64_t ids[N_VARS + 1];
  for (int v = 0; v < N_VARS; v++) ids[v] = (uint64_t)v;
  ids[N_VARS] = 1000; /* not a variable */
  CHECK(sw_client_pull(client, peer, ids, N_VARS + 1, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  EXPECT(sw_reply_count(reply) == N_VARS + 1);
  for (int v = 0; v < N_VARS; v++) {
    const float *row = sw_tensor_data(sw_reply_tensor(reply, (size_t)v));
    EXPECT(row[3] == (float)v + 0.03f);
  }
  EXPECT(sw_reply_status(reply, N_VARS) == 1 && sw_reply_tensor(reply, N_VARS) == NULL);
  sw_reply_free(reply);
  printf("pull: %d rows, and NOT_FOUND for id 1000\n", N_VARS);

  float ones[DIM];
  for (int k = 0; k < DIM; k++) ones[k] = 1.0f;
  const uint64_t dims[1] = {DIM};
  sw_tensor *grad = NULL;
  CHECK(sw_tensor_new(F32, dims, 1, ones, sizeof ones, &grad));
  const sw_tensor *grads[N_VARS];
  for (int v = 0; v < N_VARS; v++) grads[v] = grad; /* the same tensor, shared */
  CHECK(sw_client_push(client, peer, ids, grads, N_VARS, 5000, &tag));
  sw_tensor_free(grad); /* the runtime holds its own reference until sent */
  CHECK(sw_client_wait(client, tag, &reply));
  for (int v = 0; v < N_VARS; v++) EXPECT(sw_reply_status(reply, (size_t)v) == 0);
  sw_reply_free(reply);

  CHECK(sw_client_pull(client, peer, ids, N_VARS, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  for (int v = 0; v < N_VARS; v++) {
    const float *row = sw_tensor_data(sw_reply_tensor(reply, (size_t)v));
    EXPECT(row[3] == (float)v + 0.03f + 1.0f);
  }
  sw_reply_free(reply);
  printf("push: %d gradients applied (%" PRIu64 " on the PS), pull sees them\n", N_VARS,
         table.pushes);

  /* A bad address is refused with a message, and nothing is written. */
  tag = 777;
  EXPECT(sw_client_ping(client, "not an address", 0, 0, &tag) == SW_ERR_INVALID_ARGUMENT);
  EXPECT(tag == 777);
  printf("bad peer refused: %s\n", sw_last_error());

  sw_stats stats;
  CHECK(sw_runtime_stats(worker, &stats));
  printf("worker: %" PRIu64 " requests completed, %" PRIu64 " failed, %" PRIu64
         " frames out, %" PRIu64 " in\n",
         stats.requests_completed, stats.requests_failed, stats.frames_out, stats.frames_in);

  sw_client_free(client);
  sw_runtime_free(worker);
  sw_runtime_free(ps);
  printf("allocator hook: %" PRIu64 " allocations, %" PRIu64 " released\n", arena.allocated,
         arena.released);
  /* Every received tensor came from the hook: the fused recv's and both pulls' rows. */
  EXPECT(arena.allocated == N_KEYS + 2 * N_VARS && arena.released == arena.allocated);
  printf("ok\n");
  return 0;
}
