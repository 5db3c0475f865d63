/* A PS task and a worker task in C, over starwire on loopback.
 *
 * The PS owns N_VARS embedding rows (float32[DIM]) and serves pulls and pushes through
 * C callbacks (a push adds the gradient into the row); it also publishes N_KEYS tensors
 * into its rendezvous for step 1, and serves two tables of embedding rows from starwire's
 * PS table (sw_ps_table). The worker (its own runtime, as in another process) receives
 * all the keys with one fused recv, pulls the rows into memory from its own allocator
 * hook, pushes a gradient for each, and pulls again to see the update; then it pulls rows
 * of both tables in one request straight into its own arrays (a third table the PS does
 * not serve is refused, with the PS's reason), pushes gradient rows, pulls again to see
 * them applied, and asks the PS for a checkpoint: the PS saves both tables into its
 * checkpoint directory (a setting of its runtime) and answers with the manifest. Last, a
 * new table loads table 0 from that directory, as a PS restarted elsewhere would, and the
 * rows are checked; the PS table's metrics and a local save close the story. Before that,
 * an embedded client pulls the rows in one call, and the pipelined sharded client runs a
 * few steps whose pushes it does not wait for.
 *
 * Build (from the repository root, after `cargo build -p starwire-ffi`):
 *   cc -Wall -Wextra -O2 -Iffi/include ffi/examples/ps_worker.c \
 *      target/debug/libstarwire_ffi.a -lpthread -ldl -lm -o ps_worker
 * Exits 0 when every check passed. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "starwire.h"

#define N_VARS 64
#define DIM 16
#define N_KEYS 100
#define F32 10 /* wire dtype code of float32 */
#define N_ROWS 4096 /* rows of table 0 pulled at once */
#define DIM1 4      /* row width of table 1 */

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

  /* PS: listens on a free loopback port, one loop, handlers inline; saves its tables into
   * a checkpoint directory of its own when a peer asks. */
  char dir[] = "/tmp/starwire-ps-worker-XXXXXX";
  EXPECT(mkdtemp(dir) != NULL);
  static struct table table = {.lock = PTHREAD_MUTEX_INITIALIZER};
  for (int v = 0; v < N_VARS; v++)
    for (int k = 0; k < DIM; k++) table.rows[v][k] = (float)v + (float)k / 100.0f;
  sw_service service = {.user_data = &table, .pull = ps_pull, .push = ps_push};
  /* Tables of embedding rows (PS tables, each at most 2^20 rows): table 0, rows of DIM
   * floats drawn uniformly from [-0.1, 0.1] on first pull, plain SGD; table 1, rows of
   * DIM1 floats that only a push creates (a pull reports the others missing), Adagrad. */
  sw_ps_table_config cfg0 = sw_ps_table_config_default(DIM);
  cfg0.table_id = 0;
  cfg0.init = (sw_ps_init){.kind = SW_PS_INIT_UNIFORM, .scale = 0.1f, .seed = 42};
  cfg0.optimizer.kind = SW_PS_OPTIMIZER_SGD;
  cfg0.optimizer.lr = 0.5f;
  cfg0.max_rows = 1 << 20;
  cfg0.capacity = N_ROWS;
  sw_ps_table_config cfg1 = sw_ps_table_config_default(DIM1);
  cfg1.table_id = 1;
  cfg1.create = SW_PS_CREATE_ON_PUSH;
  cfg1.optimizer.kind = SW_PS_OPTIMIZER_ADAGRAD;
  cfg1.optimizer.lr = 1.0f;
  cfg1.optimizer.initial_accumulator = 1.0f;
  cfg1.max_rows = 1 << 20;
  sw_ps_table *tables[2] = {NULL, NULL};
  CHECK(sw_ps_table_new(&cfg0, &tables[0]));
  CHECK(sw_ps_table_new(&cfg1, &tables[1]));
  const uint32_t table_ids[2] = {0, 1};
  const sw_table *served[2] = {sw_ps_table_as_table(tables[0]),
                               sw_ps_table_as_table(tables[1])};
  const char *names[] = {"NETWORK_PS_CORE_NUMBER", "STARWIRE_CHECKPOINT_DIR"};
  const char *values[] = {"1", dir};
  sw_runtime_options ps_opts = {
      .job = "ps", .task_index = 0, .setting_names = names, .setting_values = values,
      .settings = 2, .use_env = true, .listen = "127.0.0.1:0", .service = &service,
      .table_ids = table_ids, .tables = served, .n_tables = 2};
  sw_runtime *ps = NULL;
  CHECK(sw_runtime_new(&ps_opts, &ps));
  /* The runtime holds its own reference to each table: table 1's handle can go; table 0's
   * is kept to save it at the end. */
  sw_ps_table_free(tables[1]);
  char *line = NULL;
  CHECK(sw_ps_table_report(tables[0], &line));
  printf("%s\n", line);
  sw_string_free(line);
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

  /* Rows of both tables in one request, into the worker's own arrays: the rows land
   * there from the socket (no copy for large blocks), not in the allocator hook's memory. */
  static float emb[N_ROWS][DIM], emb_after[N_ROWS][DIM];
  static uint64_t row_ids[N_ROWS];
  static float grad_rows[N_ROWS][DIM];
  for (int i = 0; i < N_ROWS; i++) {
    row_ids[i] = (uint64_t)i * 7919; /* any ids */
    for (int k = 0; k < DIM; k++) grad_rows[i][k] = 1.0f;
  }
  const uint64_t dim0[1] = {DIM}, dim1[1] = {DIM1};
  const uint64_t ids1[3] = {5, 6, 5};
  float small[3][DIM1];
  memset(small, 0xff, sizeof small);
  sw_rows pull[3] = {
      {.table = 0, .dtype = F32, .row_dims = dim0, .rank = 1, .ids = row_ids, .n = N_ROWS,
       .data = emb, .byte_len = sizeof emb},
      {.table = 1, .dtype = F32, .row_dims = dim1, .rank = 1, .ids = ids1, .n = 3,
       .data = small, .byte_len = sizeof small},
      {.table = 7, .dtype = F32, .row_dims = dim1, .rank = 1, .ids = ids1, .n = 3,
       .data = small, .byte_len = sizeof small}, /* not served: NOT_FOUND */
  };
  sw_stats stats;
  CHECK(sw_runtime_stats(worker, &stats));
  uint64_t direct_before = stats.payload_direct;
  CHECK(sw_client_pull_rows(client, peer, pull, 3, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  EXPECT(sw_reply_count(reply) == 3);
  EXPECT(sw_reply_status(reply, 0) == 0 && sw_reply_status(reply, 1) == 0);
  EXPECT(sw_reply_status(reply, 2) == 1 /* NOT_FOUND */);
  /* The PS's words about the table it refused (valid until the reply is freed). */
  EXPECT(strstr(sw_reply_refusal(reply), "no table 7 on this task") != NULL);
  printf("rows pull: table 7 refused: %s\n", sw_reply_refusal(reply));
  uint32_t missing[3];
  size_t n_missing = 99;
  CHECK(sw_reply_missing(reply, 0, missing, 3, &n_missing));
  EXPECT(n_missing == 0);
  CHECK(sw_reply_missing(reply, 1, missing, 3, &n_missing));
  EXPECT(n_missing == 3 && missing[0] == 0 && missing[1] == 1 && missing[2] == 2);
  sw_reply_free(reply);
  for (int i = 0; i < N_ROWS; i++)
    for (int k = 0; k < DIM; k++) EXPECT(emb[i][k] >= -0.1f && emb[i][k] <= 0.1f);
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < DIM1; k++) EXPECT(small[i][k] == 0.0f); /* missing rows: zeros */
  CHECK(sw_runtime_stats(worker, &stats));
  printf("rows pull: %d rows of table 0 into the worker's array (%" PRIu64
         " bytes straight from the socket), 3 missing of table 1, table 7 NOT_FOUND\n",
         N_ROWS, stats.payload_direct - direct_before);

  /* Gradient rows: 1.0 for every row of table 0; {4, 0, 0, 0} for id 5 of table 1. */
  float g1[1][DIM1] = {{4.0f, 0.0f, 0.0f, 0.0f}};
  sw_rows push[2] = {
      {.table = 0, .dtype = F32, .row_dims = dim0, .rank = 1, .ids = row_ids, .n = N_ROWS,
       .data = grad_rows, .byte_len = sizeof grad_rows},
      {.table = 1, .dtype = F32, .row_dims = dim1, .rank = 1, .ids = ids1, .n = 1,
       .data = g1, .byte_len = sizeof g1},
  };
  CHECK(sw_client_push_rows(client, peer, push, 2, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  EXPECT(sw_reply_count(reply) == 2);
  EXPECT(sw_reply_status(reply, 0) == 0 && sw_reply_status(reply, 1) == 0);
  sw_reply_free(reply);

  pull[0].data = emb_after;
  CHECK(sw_client_pull_rows(client, peer, pull, 2, 5000, &tag));
  CHECK(sw_client_wait(client, tag, &reply));
  EXPECT(sw_reply_status(reply, 0) == 0 && sw_reply_status(reply, 1) == 0);
  CHECK(sw_reply_missing(reply, 1, missing, 3, &n_missing));
  EXPECT(n_missing == 1 && missing[0] == 1); /* id 6: still no row */
  sw_reply_free(reply);
  for (int i = 0; i < N_ROWS; i++)
    for (int k = 0; k < DIM; k++) EXPECT(emb_after[i][k] == emb[i][k] - 0.5f); /* SGD */
  /* Adagrad from accumulator 1: acc = 1 + 16, w = 0 - 1.0 * 4 / sqrt(17). */
  EXPECT(small[0][0] < -0.97f && small[0][0] > -0.98f && small[0][1] == 0.0f);
  EXPECT(small[2][0] == small[0][0] && small[1][0] == 0.0f);
  printf("rows push: SGD and Adagrad applied; id 6 of table 1 still missing\n");

  /* A checkpoint, asked by the worker: the PS saves both tables into its own directory
   * (never named by the worker) and answers with the manifest, a JSON document. */
  char *manifest = NULL;
  CHECK(sw_client_checkpoint_wait(client, peer, 60000, &manifest));
  EXPECT(strstr(manifest, "\"file\":\"table-0.swrows\"") != NULL);
  EXPECT(strstr(manifest, "\"file\":\"table-1.swrows\"") != NULL);
  printf("checkpoint request: the PS answered %s\n", manifest);
  sw_string_free(manifest);

  /* A buffer of the wrong size is refused at once, and nothing is written. */
  pull[0].byte_len -= 1;
  tag = 777;
  EXPECT(sw_client_pull_rows(client, peer, pull, 1, 5000, &tag) == SW_ERR_INVALID_ARGUMENT);
  EXPECT(tag == 777);
  printf("bad rows buffer refused: %s\n", sw_last_error());

  /* A bad address is refused with a message, and nothing is written. */
  tag = 777;
  EXPECT(sw_client_ping(client, "not an address", 0, 0, &tag) == SW_ERR_INVALID_ARGUMENT);
  EXPECT(tag == 777);
  printf("bad peer refused: %s\n", sw_last_error());

  CHECK(sw_runtime_stats(worker, &stats));
  printf("worker: %" PRIu64 " requests completed, %" PRIu64 " failed, %" PRIu64
         " frames out, %" PRIu64 " in\n",
         stats.requests_completed, stats.requests_failed, stats.frames_out, stats.frames_in);

  /* An embedded client: its own event loop, run by this thread inside its calls (no loop
   * thread between the caller and the socket). The same calls; here the one-call rows
   * pull of a language binding, with the waits spinning up to 300 us before they sleep. */
  const char *emb_names[] = {"STARWIRE_SPIN_US"};
  const char *emb_values[] = {"300"};
  sw_client *embedded = NULL;
  CHECK(sw_client_new_embedded(worker, emb_names, emb_values, 1, &embedded));
  float emb_again[N_ROWS][DIM];
  sw_rows one = pull[0];
  one.data = emb_again;
  one.byte_len = sizeof emb_again;
  uint32_t none[N_ROWS];
  size_t n_none = 99;
  CHECK(sw_client_pull_rows_wait(embedded, peer, &one, 5000, none, &n_none));
  EXPECT(n_none == 0 && memcmp(emb_again, emb_after, sizeof emb_again) == 0);
  sw_stats own;
  CHECK(sw_client_loop_stats(embedded, &own));
  EXPECT(own.requests_completed == 1 && own.connections_opened == 1);
  printf("embedded client: %d rows in one call, %" PRIu64 " request on its own loop\n",
         N_ROWS, own.requests_completed);
  sw_client_free(embedded);

  /* The pipelined sharded client over table 0 (one PS here): the next batch's rows are
   * requested while this one computes, each push returns without waiting for its answer
   * (staleness 1, at most 2 pushes in flight), and flush waits for what is in flight.
   * Every row of the 4 batches gets a gradient of 1.0 once: SGD lowers it by 0.5. */
  pthread_mutex_lock(&arena.lock);
  uint64_t hook_before = arena.allocated;
  pthread_mutex_unlock(&arena.lock);
  enum { STEPS = 4, BATCH = 256 };
  const char *pipe_peers[1] = {peer};
  sw_partition mod = {.kind = SW_PARTITION_MOD, .vocab = 0};
  sw_pipeline *pipe = NULL;
  CHECK(sw_pipeline_new(client, pipe_peers, 1, mod, 0, F32, dim0, 1,
                        sw_pipeline_settings_default(), &pipe));
  sw_pipeline_report rep;
  size_t most_in_flight = 0;
  CHECK(sw_pipeline_prefetch(pipe, client, row_ids, BATCH, &rep));
  for (int t = 0; t < STEPS; t++) {
    const uint64_t *step_ids = row_ids + t * BATCH;
    CHECK(sw_pipeline_pull(pipe, client, step_ids, BATCH, emb_again, BATCH * sizeof emb_again[0],
                           &rep));
    if (t + 1 < STEPS) CHECK(sw_pipeline_prefetch(pipe, client, step_ids + BATCH, BATCH, &rep));
    for (int i = 0; i < BATCH; i++) /* the step's computation */
      EXPECT(memcmp(emb_again[i], emb_after[t * BATCH + i], sizeof emb_again[i]) == 0);
    CHECK(sw_pipeline_push(pipe, client, step_ids, BATCH, grad_rows, BATCH * sizeof grad_rows[0],
                           &rep));
    if (rep.pushes_in_flight > most_in_flight) most_in_flight = rep.pushes_in_flight;
  }
  CHECK(sw_pipeline_flush(pipe, client, &rep));
  EXPECT(sw_pipeline_pushes_in_flight(pipe) == 0 && sw_pipeline_steps(pipe) == STEPS);
  CHECK(sw_pipeline_pull(pipe, client, row_ids, STEPS * BATCH, emb_again,
                         STEPS * BATCH * sizeof emb_again[0], &rep));
  for (int i = 0; i < STEPS * BATCH; i++)
    for (int k = 0; k < DIM; k++) EXPECT(emb_again[i][k] == emb_after[i][k] - 0.5f);
  printf("pipeline: %d steps of %d rows, pushes not waited for (up to %zu in flight); after "
         "flush every row pushed once\n",
         STEPS, BATCH, most_in_flight);
  sw_pipeline_free(pipe);
  pthread_mutex_lock(&arena.lock);
  uint64_t pipeline_blocks = arena.allocated - hook_before;
  pthread_mutex_unlock(&arena.lock);

  sw_client_free(client);
  sw_runtime_free(worker);
  sw_runtime_free(ps);

  /* The PS table: its metrics, a checkpoint of it, and a table loaded from that. */
  sw_table_metrics m;
  sw_hot_id hot[4];
  size_t n_hot = 0;
  CHECK(sw_ps_table_metrics(tables[0], &m, hot, 4, &n_hot));
  EXPECT(m.rows == N_ROWS && m.pushed_rows == N_ROWS + STEPS * BATCH && m.missing == 0);
  printf("table 0: %" PRIu64 " rows, %" PRIu64 " pulls of %" PRIu64 " rows, %" PRIu64
         " pushes, %" PRIu64 " bytes of memory; %zu hot ids sampled\n",
         m.rows, m.pulls, m.pulled_rows, m.pushes, m.memory_bytes, n_hot);
  /* Table 0 loaded from the checkpoint the worker asked for. */
  sw_ps_table *loaded = NULL;
  CHECK(sw_ps_table_load(&cfg0, dir, &loaded));
  static float back[N_ROWS][DIM];
  uint32_t gone[N_ROWS];
  size_t n_gone = 99;
  CHECK(sw_ps_table_export_rows(loaded, row_ids, N_ROWS, &back[0][0], N_ROWS * DIM, NULL, 0,
                                gone, &n_gone));
  EXPECT(n_gone == 0 && memcmp(back, emb_after, sizeof back) == 0);
  /* A table of another row width cannot load it: a code of its own, and a message. */
  sw_ps_table_config wide = cfg0;
  wide.dim = 2 * DIM;
  sw_ps_table *refused = NULL;
  EXPECT(sw_ps_table_load(&wide, dir, &refused) == SW_ERR_CHECKPOINT_SHAPE);
  EXPECT(refused == NULL);
  printf("checkpoint: %" PRIu64 " rows of table 0 loaded back; another shape refused: %s\n",
         sw_ps_table_len(loaded), sw_last_error());
  /* The table saved by its owner, without a request: the file replaced atomically. */
  sw_save_report saved;
  CHECK(sw_ps_table_save(tables[0], dir, &saved));
  EXPECT(saved.rows == N_ROWS);
  printf("local save: %" PRIu64 " rows, %" PRIu64 " bytes in %.3f s\n", saved.rows,
         saved.bytes, saved.seconds);
  sw_ps_table_free(loaded);
  sw_ps_table_free(tables[0]);
  char file[300], name[32];
  for (uint32_t id = 0; id < 2; id++) {
    CHECK(sw_checkpoint_file(id, name, sizeof name));
    snprintf(file, sizeof file, "%s/%s", dir, name);
    EXPECT(unlink(file) == 0);
  }
  snprintf(file, sizeof file, "%s/checkpoint.json", dir);
  EXPECT(unlink(file) == 0 && rmdir(dir) == 0);
  printf("allocator hook: %" PRIu64 " allocations, %" PRIu64 " released\n", arena.allocated,
         arena.released);
  /* Every received tensor came from the hook: the fused recv's, both pulls' rows, the
   * checkpoint's manifest and the pipeline's row blocks (the rows pulls wrote into the
   * worker's own arrays instead). */
  EXPECT(arena.allocated == N_KEYS + 2 * N_VARS + 1 + pipeline_blocks &&
         arena.released == arena.allocated);
  printf("ok\n");
  return 0;
}
