/*
 * The benchmark's producer: librdkafka driven from C, so the load generator costs the machine
 * what librdkafka costs and not a Python call and a Python delivery callback per record (about
 * 3 of the 3.6 microseconds a record cost the Python worker; on 2 shared cores that CPU is taken
 * from the system under test). Built and driven by bench/native.py; the Python worker
 * (bench/workers.py) relays its counters to the orchestrator.
 *
 * It links against the librdkafka that confluent-kafka's wheel ships, which has no header, so the
 * few functions and the one struct used are declared below as librdkafka's public C API defines
 * them (stable since librdkafka 0.9).
 *
 * usage: produce TOPIC PARTITIONS RECORD_BYTES RATE KEYLESS STAMP FLUSH_TIMEOUT_MS OUT_PREFIX [key=value ...]
 *   RATE records/s (0: as fast as librdkafka takes them); KEYLESS 1: librdkafka's partitioner picks,
 *   0: record i goes to partition i % PARTITIONS; STAMP 1: the first 8 bytes of each value are
 *   CLOCK_MONOTONIC nanoseconds at produce time (little-endian). key=value pairs are librdkafka
 *   configuration (bootstrap.servers among them).
 * stdin:  "run" starts producing, "stop" flushes and ends, "abort" ends without flushing.
 * stdout: "ready", then "progress SENT ACKED FAILED" every 100 ms, then
 *         "done SENT ACKED FAILED UNACKED FIRST_ERROR". OUT_PREFIX.acks and OUT_PREFIX.latencies
 *         hold one float64 per acknowledged record: CLOCK_MONOTONIC seconds when its delivery
 *         report arrived, and librdkafka's produce-to-acknowledgement latency in seconds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_conf_s rd_kafka_topic_conf_t;
typedef struct rd_kafka_message_s {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

rd_kafka_conf_t *rd_kafka_conf_new(void);
int rd_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, char *errstr, size_t errstr_size);
void rd_kafka_conf_set_dr_msg_cb(rd_kafka_conf_t *conf, void (*cb)(rd_kafka_t *, const rd_kafka_message_t *, void *));
rd_kafka_t *rd_kafka_new(int type, rd_kafka_conf_t *conf, char *errstr, size_t errstr_size);
rd_kafka_topic_t *rd_kafka_topic_new(rd_kafka_t *rk, const char *topic, rd_kafka_topic_conf_t *conf);
int rd_kafka_produce(rd_kafka_topic_t *rkt, int32_t partition, int msgflags, void *payload, size_t len,
                     const void *key, size_t keylen, void *msg_opaque);
int rd_kafka_produce_batch(rd_kafka_topic_t *rkt, int32_t partition, int msgflags, rd_kafka_message_t *rkmessages, int message_cnt);
int rd_kafka_poll(rd_kafka_t *rk, int timeout_ms);
int rd_kafka_flush(rd_kafka_t *rk, int timeout_ms);
int rd_kafka_outq_len(rd_kafka_t *rk);
int rd_kafka_purge(rd_kafka_t *rk, int purge_flags);
int rd_kafka_last_error(void);
const char *rd_kafka_err2str(int err);
int64_t rd_kafka_message_latency(const rd_kafka_message_t *rkmessage);
void rd_kafka_topic_destroy(rd_kafka_topic_t *rkt);
void rd_kafka_destroy(rd_kafka_t *rk);

#define RD_KAFKA_PRODUCER 0
#define RD_KAFKA_PARTITION_UA (-1)
#define RD_KAFKA_MSG_F_COPY 0x2
#define RD_KAFKA_MSG_F_PARTITION 0x8
#define RD_KAFKA_RESP_ERR__QUEUE_FULL (-184)
#define RD_KAFKA_PURGE_F_QUEUE 0x1
#define RD_KAFKA_PURGE_F_INFLIGHT 0x2

/* Samples grow in blocks; a minute at a million records/s is 2 x 480 MB, so no fixed cap. */
typedef struct {
    double *v;
    size_t n, cap;
} samples_t;

static samples_t acks, latencies;
static long long acked, failed;
static char first_error[256];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void push(samples_t *s, double x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1 << 16;
        s->v = realloc(s->v, s->cap * sizeof(double));
        if (!s->v) {
            fprintf(stderr, "out of memory for %zu samples\n", s->cap);
            exit(3);
        }
    }
    s->v[s->n++] = x;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk, (void)opaque;
    if (m->err == 0) {
        acked++;
        int64_t us = rd_kafka_message_latency(m);
        push(&acks, now_s());
        push(&latencies, us < 0 ? (double)NAN : (double)us / 1e6);
    } else {
        failed++;
        if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", rd_kafka_err2str(m->err));
    }
}

/* The next command on stdin, without waiting: 'r'un, 's'top, 'a'bort, or 0 for none yet. */
static char command(int wait_ms) {
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, wait_ms) <= 0) return 0;
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 'a'; /* the worker is gone: stop at once */
    return line[0];
}

static void write_samples(const char *prefix, const char *suffix, const samples_t *s) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s->v, sizeof(double), s->n, f) != s->n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(4);
    }
}

int main(int argc, char **argv) {
    if (argc < 9) {
        fprintf(stderr, "usage: %s TOPIC PARTITIONS RECORD_BYTES RATE KEYLESS STAMP FLUSH_TIMEOUT_MS OUT_PREFIX [key=value ...]\n", argv[0]);
        return 2;
    }
    const char *topic = argv[1];
    int partitions = atoi(argv[2]);
    size_t record_bytes = (size_t)atol(argv[3]);
    double rate = atof(argv[4]);
    int keyless = atoi(argv[5]), stamp = atoi(argv[6]);
    int flush_timeout_ms = atoi(argv[7]);
    const char *out = argv[8];
    if (partitions < 1 || record_bytes < (stamp ? 8u : 0u)) {
        fprintf(stderr, "need at least one partition and, with STAMP, records of 8 bytes or more\n");
        return 2;
    }

    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    for (int i = 9; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "not key=value: %s\n", argv[i]);
            return 2;
        }
        *eq = 0;
        if (rd_kafka_conf_set(conf, argv[i], eq + 1, err, sizeof err) != 0) {
            fprintf(stderr, "librdkafka refused %s: %s\n", argv[i], err);
            return 2;
        }
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "rd_kafka_new: %s\n", err);
        return 2;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);

    char *value = malloc(record_bytes ? record_bytes : 1);
    FILE *urandom = fopen("/dev/urandom", "rb");
    if (!value || !urandom || fread(value, 1, record_bytes, urandom) != record_bytes) {
        fprintf(stderr, "cannot fill a %zu-byte record from /dev/urandom\n", record_bytes);
        return 2;
    }
    fclose(urandom);

    printf("ready\n");
    fflush(stdout);
    char cmd;
    while ((cmd = command(1000)) != 'r') {
        if (cmd == 'a' || cmd == 's') return 0;
    }

    /* Unstamped records all share the one value, which never changes: librdkafka may keep a
     * pointer to it instead of copying it per record (it copies values into its batches anyway).
     * Stamped ones each need their own bytes until librdkafka has copied them (RD_KAFKA_MSG_F_COPY). */
    int batch_max = 256;
    if (stamp && (size_t)batch_max * record_bytes > ((size_t)4 << 20)) batch_max = (int)(((size_t)4 << 20) / record_bytes) + 1;
    int flags = (stamp ? RD_KAFKA_MSG_F_COPY : 0) | (keyless ? 0 : RD_KAFKA_MSG_F_PARTITION);
    rd_kafka_message_t *batch = calloc((size_t)batch_max, sizeof *batch);
    char *stamped = stamp ? malloc((size_t)batch_max * record_bytes) : NULL;
    if (!batch || (stamp && !stamped)) {
        fprintf(stderr, "out of memory for a batch of %d records\n", batch_max);
        return 2;
    }
    for (int i = 0; stamp && i < batch_max; i++) memcpy(stamped + (size_t)i * record_bytes, value, record_bytes);

    long long sent = 0;
    double started = now_s(), next_progress = started;
    char stop = 0;
    while (!stop) {
        long long burst = 1000;
        if (rate > 0) {
            long long due = (long long)((now_s() - started) * rate) - sent;
            burst = due < 1000 ? due : 1000;
            if (burst <= 0) {
                rd_kafka_poll(rk, 1);
                burst = 0;
            }
        }
        /* Records go to librdkafka in batches (rd_kafka_produce_batch: one queue lock per batch,
         * not per record). A refused record (the queue is full: saturation) ends the burst; the
         * records refused are always the batch's last, so record i still goes to partition i % N. */
        while (burst > 0) {
            int n = burst < batch_max ? (int)burst : batch_max;
            for (int i = 0; i < n; i++) {
                rd_kafka_message_t *m = &batch[i];
                memset(m, 0, sizeof *m);
                if (stamp) {
                    char *v = stamped + (size_t)i * record_bytes;
                    int64_t t = now_ns();
                    memcpy(v, &t, sizeof t); /* x86-64 is little-endian, as bench/workers.STAMP reads it */
                    m->payload = v;
                } else {
                    m->payload = value;
                }
                m->len = record_bytes;
                m->partition = keyless ? RD_KAFKA_PARTITION_UA : (int32_t)((sent + i) % partitions);
            }
            rd_kafka_produce_batch(rkt, RD_KAFKA_PARTITION_UA, flags, batch, n);
            int accepted = 0, refused = 0;
            for (int i = 0; i < n; i++) {
                if (batch[i].err == 0) {
                    if (refused) {
                        fprintf(stderr, "librdkafka took record %d of a batch after refusing an earlier one\n", i);
                        return 1;
                    }
                    accepted++;
                } else if (batch[i].err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                    refused++;
                } else {
                    fprintf(stderr, "produce: %s\n", rd_kafka_err2str(batch[i].err));
                    return 1;
                }
            }
            sent += accepted;
            burst -= n;
            if (refused) {
                rd_kafka_poll(rk, 1); /* librdkafka's queue is full: that is saturation, wait for acks */
                break;
            }
        }
        rd_kafka_poll(rk, 0);
        double now = now_s();
        if (now >= next_progress) {
            printf("progress %lld %lld %lld\n", sent, acked, failed);
            fflush(stdout);
            next_progress = now + 0.1;
            stop = command(0);
            if (stop != 's' && stop != 'a') stop = 0;
        }
    }

    if (stop == 's') {
        double deadline = now_s() + flush_timeout_ms / 1000.0;
        while (rd_kafka_outq_len(rk) > 0 && now_s() < deadline) {
            rd_kafka_flush(rk, 200);
            printf("progress %lld %lld %lld\n", sent, acked, failed);
            fflush(stdout);
            char c = command(0);
            if (c == 'a') break;
        }
    }
    int unacked = rd_kafka_outq_len(rk);
    if (unacked > 0) {
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(rk, 5000);
    }
    write_samples(out, "acks", &acks);
    write_samples(out, "latencies", &latencies);
    printf("done %lld %lld %lld %d %s\n", sent, acked, failed, unacked, first_error[0] ? first_error : "-");
    fflush(stdout);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return 0;
}
