/* test_hw_profile.c: hardware profiles (core/plan/hardware.c): the shipped ones carry their datasheet
 * figures, a written profile reads back bit for bit, every bad input is one line naming file, line
 * and key, names are found on the search path, and calibrated measurements are looked up and
 * interpolated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan/plan.h"
#include "base/error.h"
#include "tmpdir.h"

#define GIB 1073741824.0

/* ---- helpers ---- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A valid profile; the tests below change one line of it (line numbers matter). */
static const char *const base_lines[] = {
    "name: \"Test GPU\"",                    /* 1 */
    "source: \"unit test\"",                 /* 2 */
    "gpus_per_node: 8",                      /* 3 */
    "compute:",                              /* 4 */
    "  bf16_tflops: 989.5",                  /* 5 */
    "  fp8_tflops: 1979",                    /* 6 */
    "  fp32_tflops: 67",                     /* 7 */
    "memory:",                               /* 8 */
    "  size_gib: 80",                        /* 9 */
    "  bandwidth_gb_s: 3350",                /* 10 */
    "intra_node:",                           /* 11 */
    "  bandwidth_gb_s: 450",                 /* 12 */
    "  latency_us: 2",                       /* 13 */
    "inter_node:",                           /* 14 */
    "  bandwidth_gb_s: 50",                  /* 15 */
    "  latency_us: 5",                       /* 16 */
    "assumptions:",                          /* 17 */
    "  matmul_efficiency: 0.7",              /* 18 */
    "  attention_efficiency: 0.6",           /* 19 */
    "  memory_efficiency: 0.8",              /* 20 */
    "  runtime_overhead_gib: 3",             /* 21 */
    "  allocator_slack: 0.1",                /* 22 */
    "  headroom: 0.05",                      /* 23 */
    "measured:",                             /* 24 */
    "  ops:",                                /* 25 */
    "    - {kind: gemm, shape: [8, 16, 32], dtype: bf16, forward_s: 1e-3, backward_s: 2e-3}", /* 26 */
    "  comms:",                              /* 27 */
    "    - {kind: all_gather, ranks: 8, bytes: 1048576, seconds: 2e-5}", /* 28 */
};
#define N_BASE (int)(sizeof base_lines / sizeof *base_lines)

/* The base profile with line `line` (1-based) replaced by `text` (NULL: removed; a text with '\n'
 * inserts lines), written to dir/case.yaml; returns hw_profile_load's status. */
static ct_status load_variant(int line, const char *text, hw_profile *hw, char *path) {
    char yaml[4096] = "";
    for (int i = 1; i <= N_BASE; i++) {
        const char *l = i == line ? text : base_lines[i - 1];
        if (!l) continue;
        strcat(yaml, l);
        strcat(yaml, "\n");
    }
    snprintf(path, 256, "%s/case.yaml", dir);
    write_text(path, yaml);
    return hw_profile_load(path, hw);
}

/* Line `line` replaced by `text` must be refused with "PATH:expect..." (expect starts at the line). */
static void refused(int line, const char *text, const char *expect) {
    hw_profile hw;
    char path[256], want[1400];
    if (load_variant(line, text, &hw, path) == CT_OK)
        fail_msg("accepted line %d = '%s'", line, text ? text : "(removed)");
    const char *err = ct_last_error();
    snprintf(want, sizeof want, "%s:%s", path, expect);
    if (strncmp(err, want, strlen(want))) fail_msg("line %d = '%s':\n got  %s\n want %s...", line, text, err, want);
    assert_null(strchr(err, '\n'));
    assert_null(hw.ops); /* nothing left behind */
    assert_int_equal(hw.n_ops, 0);
}

static void assert_same(const hw_profile *a, const hw_profile *b) {
    assert_string_equal(a->name, b->name);
    assert_string_equal(a->source, b->source);
    /* doubles compared exactly: a written profile must read back bit for bit */
    const double *da[] = {&a->mem_bytes, &a->mem_bw, &a->peak_flops[0], &a->peak_flops[1], &a->peak_flops[2],
                          &a->matmul_eff, &a->attn_eff, &a->mem_eff, &a->intra_bw, &a->intra_lat, &a->inter_bw,
                          &a->inter_lat, &a->overhead_bytes, &a->alloc_frac, &a->headroom_frac, &a->host_bw, &a->host_mem};
    const double *db[] = {&b->mem_bytes, &b->mem_bw, &b->peak_flops[0], &b->peak_flops[1], &b->peak_flops[2],
                          &b->matmul_eff, &b->attn_eff, &b->mem_eff, &b->intra_bw, &b->intra_lat, &b->inter_bw,
                          &b->inter_lat, &b->overhead_bytes, &b->alloc_frac, &b->headroom_frac, &b->host_bw, &b->host_mem};
    for (size_t i = 0; i < sizeof da / sizeof *da; i++)
        if (*da[i] != *db[i]) fail_msg("field %zu: %.17g != %.17g", i, *da[i], *db[i]);
    assert_int_equal(a->gpus_per_node, b->gpus_per_node);
    assert_int_equal(a->calibrated, b->calibrated);
    assert_int_equal(a->n_ops, b->n_ops);
    assert_int_equal(a->n_comms, b->n_comms);
    for (int i = 0; i < a->n_ops; i++) {
        assert_int_equal(a->ops[i].kind, b->ops[i].kind);
        assert_int_equal(a->ops[i].dtype, b->ops[i].dtype);
        assert_memory_equal(a->ops[i].shape, b->ops[i].shape, sizeof a->ops[i].shape);
        assert_true(a->ops[i].seconds[0] == b->ops[i].seconds[0] && a->ops[i].seconds[1] == b->ops[i].seconds[1]);
    }
    for (int i = 0; i < a->n_comms; i++) {
        assert_int_equal(a->comms[i].kind, b->comms[i].kind);
        assert_int_equal(a->comms[i].ranks, b->comms[i].ranks);
        assert_true(a->comms[i].bytes == b->comms[i].bytes && a->comms[i].seconds == b->comms[i].seconds);
    }
}

/* Writes a, loads it back into b (caller frees b). */
static void round_trip(const hw_profile *a, hw_profile *b) {
    char path[256];
    snprintf(path, sizeof path, "%s/written.yaml", dir);
    if (hw_profile_write(a, path)) fail_msg("write: %s", ct_last_error());
    if (hw_profile_load(path, b)) fail_msg("load of the written profile: %s", ct_last_error());
    assert_string_equal(b->path, path);
}

/* ---- the shipped profiles ---- */

typedef struct sheet {
    const char *name;
    double bf16, fp8, fp32, mem_gib, mem_bw, nvlink, net, pcie; /* TFLOP/s, GiB, GB/s */
} sheet;

static void test_shipped_profiles_have_their_datasheet_numbers(void **state) {
    (void)state;
    unsetenv("CTITAN_HARDWARE_PATH");
    static const sheet sheets[] = {
        /* dense = the datasheets' "with sparsity" figures halved; NVLink one direction = half the
         * bidirectional figure; network = one 400 (200 for A100) Gb/s NIC per GPU; the host link half
         * of PCIe Gen5's (Gen4's for A100) both-directions figure (B200's: an assumption) */
        {"h100-sxm", 989.5, 1979, 67, 80, 3350, 450, 50, 64},
        {"h200", 989.5, 1979, 67, 141, 4800, 450, 50, 64},
        {"a100-80gb", 312, 312, 19.5, 80, 2039, 300, 25, 32}, /* no FP8: the bf16 rate */
        {"b200", 2250, 4500, 75, 180, 7700, 900, 50, 64},
    };
    for (size_t i = 0; i < sizeof sheets / sizeof *sheets; i++) {
        const sheet *s = &sheets[i];
        hw_profile hw, again;
        char suffix[64];
        if (hw_profile_load(s->name, &hw)) fail_msg("%s: %s", s->name, ct_last_error());
        snprintf(suffix, sizeof suffix, "/configs/hardware/%s.yaml", s->name);
        assert_string_equal(hw.path + strlen(hw.path) - strlen(suffix), suffix);
        assert_non_null(strstr(hw.name, "NVIDIA"));
        assert_non_null(strstr(hw.source, "nvidia.com"));
        assert_true(hw.peak_flops[PLAN_BF16] == s->bf16 * 1e12);
        assert_true(hw.peak_flops[PLAN_FP8] == s->fp8 * 1e12);
        assert_true(hw.peak_flops[PLAN_F32] == s->fp32 * 1e12);
        assert_true(hw.mem_bytes == s->mem_gib * GIB);
        assert_true(hw.mem_bw == s->mem_bw * 1e9);
        assert_true(hw.intra_bw == s->nvlink * 1e9);
        assert_true(hw.inter_bw == s->net * 1e9);
        assert_true(hw.host_bw == s->pcie * 1e9);
        assert_true(hw.host_mem == 256e9); /* the DGX systems' 2 TB over 8 GPUs */
        assert_int_equal(hw.gpus_per_node, 8);
        assert_true(hw.intra_lat == 2e-6 && hw.inter_lat == 5e-6);
        assert_true(hw.matmul_eff == 0.7 && hw.attn_eff == 0.6 && hw.mem_eff == 0.8);
        assert_true(hw.overhead_bytes == 3 * GIB && hw.alloc_frac == 0.1 && hw.headroom_frac == 0.05);
        assert_int_equal(hw.calibrated, 0);
        assert_int_equal(hw.n_ops + hw.n_comms, 0);
        round_trip(&hw, &again);
        assert_same(&hw, &again);
        hw_profile_free(&again);
        hw_profile_free(&hw);
    }
    char list[1024];
    hw_profile_list(list, sizeof list);
    assert_non_null(strstr(list, "a100-80gb, b200, h100-sxm, h200"));
    hw_profile hw; /* a path works as well as a name */
    assert_int_equal(hw_profile_load("configs/hardware/h200.yaml", &hw), 0);
    assert_string_equal(hw.path, "configs/hardware/h200.yaml");
    hw_profile_free(&hw);
}

/* ---- writing ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) { /* (0, 1], every bit of the mantissa random */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((rng >> 11) + 1) * 0x1.0p-53;
}
/* A double of any bits in (lo, hi], spread over the decades between. */
static double any_in(double lo, double hi) {
    double l = log(lo > 0 ? lo : 1e-9), h = log(hi);
    return fmin(hi, exp(l + (h - l) * uniform()));
}

static void random_profile(hw_profile *hw, plan_measured_op *ops, plan_measured_comm *comms) {
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "GPU \"%d\" \\ \xc2\xb5s \xf0\x9f\x9a\x80 #x: y", (int)(uniform() * 1000));
    snprintf(hw->source, sizeof hw->source, "{calibrated}: ctitan plan --calibrate, 'quoted', [list], &a *b %% - ?");
    hw->gpus_per_node = 1 + (int)(uniform() * 71);
    hw->calibrated = uniform() < 0.5;
    for (int d = 0; d < PLAN_NDTYPES; d++) hw->peak_flops[d] = any_in(1e6, 1e17);
    hw->mem_bytes = any_in(1e9, 1e12);
    hw->mem_bw = any_in(1e6, 1e14);
    hw->matmul_eff = uniform(), hw->attn_eff = uniform(), hw->mem_eff = uniform();
    hw->intra_bw = any_in(1e3, 1e14), hw->inter_bw = any_in(1e3, 1e14);
    hw->intra_lat = any_in(1e-12, 1), hw->inter_lat = uniform() < 0.2 ? 0 : any_in(1e-12, 1);
    hw->host_bw = uniform() < 0.3 ? 0 : any_in(1e3, 1e14); /* optional: 0 leaves host_link out */
    hw->host_mem = uniform() < 0.3 ? 0 : any_in(1e6, 1e14);
    hw->overhead_bytes = uniform() < 0.2 ? 0 : any_in(1, 1e8);
    hw->alloc_frac = uniform() < 0.2 ? 0 : uniform();
    hw->headroom_frac = uniform() * 0.999;
    hw->ops = ops, hw->comms = comms;
    hw->n_ops = 3, hw->n_comms = 3;
    for (int i = 0; i < 3; i++) {
        ops[i] = (plan_measured_op){i * 5 % RT_OP_NKINDS, {8192, 4096 + i, 14336, i}, i % PLAN_NDTYPES,
                                    {any_in(1e-9, 10), i ? any_in(1e-9, 10) : 0}};
        comms[i] = (plan_measured_comm){i == 0 ? 1 : i == 1 ? 3 : 4, 2 + i, any_in(1, 1e12), any_in(1e-7, 10)};
    }
}

static void test_write_then_load_is_exact(void **state) {
    (void)state;
    plan_measured_op ops[3];
    plan_measured_comm comms[3];
    for (int round = 0; round < 300; round++) {
        hw_profile a, b;
        random_profile(&a, ops, comms);
        if (round == 0) { /* awkward decimal values at the unit boundaries */
            a.peak_flops[PLAN_BF16] = 989.4e12, a.peak_flops[PLAN_FP8] = nextafter(1978.9e12, 0);
            a.mem_bw = 0.1 + 0.2, a.intra_lat = 1e-6 / 3, a.headroom_frac = 0, a.mem_eff = 1;
            a.mem_bytes = 80e9, a.overhead_bytes = nextafter(3 * GIB, 1e300);
        }
        round_trip(&a, &b);
        assert_same(&a, &b);
        hw_profile_free(&b);
    }
    /* the written text is readable: shortest exact decimals in the file's units */
    hw_profile a, b;
    random_profile(&a, ops, comms);
    a.peak_flops[PLAN_BF16] = 989.4e12, a.mem_bytes = 80 * GIB, a.intra_lat = 2e-6, a.n_comms = 0;
    round_trip(&a, &b);
    hw_profile_free(&b);
    char path[256], text[8192];
    snprintf(path, sizeof path, "%s/written.yaml", dir);
    FILE *f = fopen(path, "r");
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    assert_non_null(strstr(text, "\n  bf16_tflops: 989.4\n"));
    assert_non_null(strstr(text, "\n  size_gib: 80\n"));
    assert_non_null(strstr(text, "\n  latency_us: 2\n"));
    assert_null(strstr(text, "comms:"));
}

static void test_write_refuses_what_load_would_refuse(void **state) {
    (void)state;
    plan_measured_op ops[3];
    plan_measured_comm comms[3];
    hw_profile a;
    char path[256];
    snprintf(path, sizeof path, "%s/refused.yaml", dir);
    random_profile(&a, ops, comms);
    a.matmul_eff = 0;
    assert_int_equal(hw_profile_write(&a, path), CT_ERR_INVALID);
    assert_non_null(
        strstr(ct_last_error(), "assumptions.matmul_efficiency: the value is out of range; expected a fraction in (0, 1]"));
    random_profile(&a, ops, comms);
    a.inter_bw = NAN;
    assert_int_equal(hw_profile_write(&a, path), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "inter_node.bandwidth_gb_s"));
    random_profile(&a, ops, comms);
    strcpy(a.name, "two\nlines");
    assert_int_equal(hw_profile_write(&a, path), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "name: the value holds a control character"));
    random_profile(&a, ops, comms);
    comms[1].kind = 2; /* CT_COLL_ALL_GATHER_SLICE has no name in a profile */
    assert_int_equal(hw_profile_write(&a, path), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "measured.comms[1]: kind 2"));
    random_profile(&a, ops, comms);
    ops[2] = ops[0];
    assert_int_equal(hw_profile_write(&a, path), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "measured.ops[2]: the same kind, shape and dtype as measured.ops[0]"));
    assert_int_equal(access(path, F_OK), -1); /* nothing written, no temporary left */
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d));) assert_null(strstr(e->d_name, ".tmp-"));
    closedir(d);
}

/* ---- bad input ---- */

static void test_bad_values_name_line_and_key(void **state) {
    (void)state;
    hw_profile hw;
    char path[256];
    assert_int_equal(load_variant(0, NULL, &hw, path), 0); /* the base is valid */
    assert_int_equal(hw.n_ops, 1);
    assert_int_equal(hw.ops[0].shape[2], 32);
    assert_int_equal(hw.ops[0].shape[3], 0);
    assert_int_equal(hw.comms[0].kind, CT_COLL_ALL_GATHER);
    hw_profile_free(&hw);
    refused(5, "  bf16_tflops: fast", "5: compute.bf16_tflops: 'fast' is not a number; expected dense TFLOP/s in (0, 100000]");
    refused(5, "  bf16_tflops: 0x10", "5: compute.bf16_tflops: '0x10' is not a number");
    refused(5, "  bf16_tflops: inf", "5: compute.bf16_tflops: 'inf' is not a number");
    refused(5, "  bf16_tflops: .nan", "5: compute.bf16_tflops: '.nan' is not a number");
    refused(5, "  bf16_tflops: 989.5e12", "5: compute.bf16_tflops: 989.5e12 is out of range"); /* FLOP/s, not TFLOP/s */
    refused(5, "  bf16_tflops: 0", "5: compute.bf16_tflops: 0 is out of range");
    refused(6, "  fp8_tflops: nothing", "6: compute.fp8_tflops: 'nothing' is not a number; expected dense TFLOP/s (or none");
    refused(10, "  bandwidth_gb_s: -3350", "10: memory.bandwidth_gb_s: -3350 is out of range; expected GB/s in (0, 1e+06]");
    refused(15, "  bandwidth_gb_s: -50", "15: inter_node.bandwidth_gb_s: -50 is out of range");
    refused(13, "  latency_us: -1", "13: intra_node.latency_us: -1 is out of range; expected microseconds in [0, 1e+06]");
    refused(18, "  matmul_efficiency: 1.5", "18: assumptions.matmul_efficiency: 1.5 is out of range; expected a fraction in (0, 1]");
    refused(19, "  attention_efficiency: 0", "19: assumptions.attention_efficiency: 0 is out of range");
    refused(20, "  memory_efficiency: -0.1", "20: assumptions.memory_efficiency: -0.1 is out of range");
    refused(22, "  allocator_slack: 2", "22: assumptions.allocator_slack: 2 is out of range; expected a fraction in [0, 1]");
    refused(23, "  headroom: 1", "23: assumptions.headroom: 1 is out of range; expected a fraction in [0, 1)");
    refused(21, "  runtime_overhead_gib: 80",
            "21: assumptions.runtime_overhead_gib: the runtime overhead is not less than the memory");
    refused(3, "gpus_per_node: 8.5", "3: gpus_per_node: '8.5' is not a whole number in range; expected GPUs in [1, 65536]");
    refused(3, "gpus_per_node: 0", "3: gpus_per_node: '0' is not a whole number in range");
    refused(3, "gpus_per_node: 99999999999999999999", "3: gpus_per_node: '99999999999999999999' is not a whole number");
    refused(3, "calibrated: maybe", "3: calibrated: 'maybe' is not true or false");
    refused(1, "name:", "1: name: no value; expected the GPU's name");
    refused(1, "name: \"\"", "1: name: the value is empty");
    refused(1, "name: \"a\\tb\"", "1: name: the value holds a control character");
    refused(1, "name: [a, b]", "1: name: a list where a plain value belongs");
}

static void test_bad_structure_names_line_and_key(void **state) {
    (void)state;
    refused(5, "  bf16_tflop: 989.5", "5: compute.bf16_tflop: unknown key; expected one of bf16_tflops, fp8_tflops, fp32_tflops");
    refused(3, "gpus_per_nodes: 8", "3: gpus_per_nodes: unknown key; expected one of name, source, gpus_per_node, "
            "calibrated, core_share, comm_overlap, compute, memory, intra_node, inter_node, host_link, assumptions, "
            "measured");
    /* host_link is optional (the base has none); given, it is checked like the others */
    refused(17, "host_link:\n  bandwidth_gb_s: 0\nassumptions:",
            "18: host_link.bandwidth_gb_s: 0 is out of range; expected GB/s per GPU to host memory");
    refused(17, "host_link:\n  bandwidth: 64\nassumptions:", "18: host_link.bandwidth: unknown key; expected one of "
            "bandwidth_gb_s, memory_gb");
    refused(7, NULL, "4: compute.fp32_tflops: missing; expected dense TFLOP/s in (0, 100000]");
    refused(9, NULL, "8: memory.size_gib: missing (or memory.size_gb in GB); expected GiB in (0, 100000]");
    refused(3, NULL, "1: gpus_per_node: missing; expected GPUs in [1, 65536]");
    refused(14, "inter:", "14: inter: unknown key");
    refused(7, "  fp32_tflops: 67\n  fp8_tflops: 1", "8: compute.fp8_tflops: duplicate key (first given at line 6)");
    refused(9, "  size_gib: 80\n  size_gb: 80", "10: memory.size_gb: given with memory.size_gib at line 9; give one of the two");
    refused(17, "assumptions:\n  matmul_efficiency: 0.7\ncompute:", "19: compute: duplicate section (first given at line 4)");
    /* a missing section: drop inter_node's three lines by turning them into comments */
    hw_profile hw;
    char path[256];
    snprintf(path, sizeof path, "%s/case.yaml", dir);
    write_text(path, "name: x\nsource: y\ngpus_per_node: 1\ncompute: {bf16_tflops: 1, fp8_tflops: none, fp32_tflops: 1}\n"
                     "memory: {size_gb: 1, bandwidth_gb_s: 1}\nintra_node: {bandwidth_gb_s: 1, latency_us: 0}\n"
                     "assumptions: {matmul_efficiency: 1, attention_efficiency: 1, memory_efficiency: 1,\n"
                     "  runtime_overhead_gb: 0, allocator_slack: 0, headroom: 0}\n");
    assert_int_equal(hw_profile_load(path, &hw), CT_ERR_INVALID);
    assert_non_null(
        strstr(ct_last_error(), "case.yaml:1: inter_node: missing section; expected a map of bandwidth_gb_s, latency_us"));
    /* ... which, given, makes a minimal profile that loads: fp8 none is the bf16 rate */
    FILE *f = fopen(path, "a");
    fputs("inter_node: {bandwidth_gb_s: 1, latency_us: 0}\n", f);
    fclose(f);
    if (hw_profile_load(path, &hw)) fail_msg("%s", ct_last_error());
    assert_true(hw.peak_flops[PLAN_FP8] == hw.peak_flops[PLAN_BF16] && hw.mem_bytes == 1e9);
    hw_profile_free(&hw);
    write_text(path, "name: x\nsource: y\ngpus_per_node: 1\ncompute: 5\n");
    assert_int_equal(hw_profile_load(path, &hw), CT_ERR_INVALID);
    assert_non_null(
        strstr(ct_last_error(), "case.yaml:4: compute: expected a map of keys (bf16_tflops, fp8_tflops, fp32_tflops)"));
    /* YAML-level problems */
    refused(6, "  fp8_tflops: &x 1979", "6: an anchor or alias");
    refused(28, "    - {kind: all_gather, ranks: 8, bytes: 1048576, seconds: 2e-5}\n---\nname: again",
            "29: a second YAML document");
    refused(5, "  bf16_tflops: [1", "6:13: YAML syntax error: did not find expected ',' or ']'");
    refused(1, "name: [[[[[[[[[[x]]]]]]]]]]", "1: maps and lists nested deeper than 8 levels");
    char *big = malloc((4 << 20) + 2); /* past the size limit: refused before it is parsed */
    memset(big, '#', (4 << 20) + 1);
    big[(4 << 20) + 1] = 0;
    write_text(path, big);
    free(big);
    assert_int_equal(hw_profile_load(path, &hw), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "case.yaml:1: the hardware profile is larger than 4 MiB"));
    write_text(path, "");
    assert_int_equal(hw_profile_load(path, &hw), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "case.yaml:1: expected a hardware profile"));
    write_text(path, "- a\n- b\n");
    assert_int_equal(hw_profile_load(path, &hw), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "case.yaml:1: expected a hardware profile"));
}

static void test_bad_measurements_name_line_and_key(void **state) {
    (void)state;
    const char *op = "    - {kind: gemm, shape: [8, 16, 32], dtype: bf16, forward_s: 1e-3, backward_s: 2e-3}";
    char twice[256];
    snprintf(twice, sizeof twice, "%s\n%s", op, op);
    refused(26, "    - {kind: gemmm, shape: [8], dtype: bf16, forward_s: 1, backward_s: 2}",
            "26: measured.ops[0].kind: 'gemmm' is unknown; expected one of gemm, attention, embedding, rmsnorm, "
            "layernorm, rope, swiglu, gelu, add, bias, xent, cast, custom, collective");
    refused(26, "    - {kind: gemm, shape: [1, 2, 3, 4, 5], dtype: bf16, forward_s: 1, backward_s: 2}",
            "26: measured.ops[0].shape: 5 numbers; expected a list of 1 to 4 whole numbers");
    refused(26, "    - {kind: gemm, shape: [8, -1], dtype: bf16, forward_s: 1, backward_s: 2}",
            "26: measured.ops[0].shape: '-1' is not a whole number");
    refused(26, "    - {kind: gemm, shape: [8, \"16,32\"], dtype: bf16, forward_s: 1, backward_s: 2}",
            "26: measured.ops[0].shape: '16,32' is not a whole number"); /* one item, not two */
    refused(26, "    - kind: gemm\n      shape:\n        - 8\n        - -1\n      dtype: bf16\n      forward_s: 1\n"
            "      backward_s: 2", "29: measured.ops[0].shape: '-1' is not a whole number"); /* the item's own line */
    refused(26, "    - {kind: gemm, shape: 8, dtype: bf16, forward_s: 1, backward_s: 2}",
            "26: measured.ops[0].shape: expected a list");
    refused(26, "    - {kind: gemm, shape: [8], dtype: fp16, forward_s: 1, backward_s: 2}",
            "26: measured.ops[0].dtype: 'fp16' is unknown; expected one of fp32, bf16, fp8");
    refused(26, "    - {kind: gemm, shape: [8], dtype: bf16, forward_s: 0, backward_s: 2}",
            "26: measured.ops[0].forward_s: 0 is out of range; expected seconds in (0, 1e+06]");
    refused(26, "    - {kind: gemm, shape: [8], dtype: bf16, forward_s: 1, backward_s: -2}",
            "26: measured.ops[0].backward_s: -2 is out of range; expected seconds in [0, 1e+06]");
    refused(26, "    - {kind: gemm, shape: [8], dtype: bf16, forward_s: 1}",
            "26: measured.ops[0]: missing backward_s; expected each of kind, shape, dtype, forward_s, backward_s");
    refused(26, "    - {kind: gemm, shape: [8], dtype: bf16, forward_s: 1, backward_s: 2, flops: 3}",
            "26: measured.ops[0].flops: unknown key");
    refused(26, twice, "27: measured.ops[1]: the same kind, shape and dtype as line 26; give each once");
    refused(26, "    - gemm", "26: measured.ops[0]: expected a map of kind, shape, dtype, forward_s, backward_s");
    refused(28, "    - {kind: broadcast, ranks: 8, bytes: 1, seconds: 1}",
            "28: measured.comms[0].kind: 'broadcast' is unknown; expected one of all_gather, reduce_scatter, all_reduce, all_to_all");
    refused(28, "    - {kind: all_reduce, ranks: 0, bytes: 1, seconds: 1}", "28: measured.comms[0].ranks: '0' is out of range");
    refused(28, "    - {kind: all_reduce, ranks: 8, bytes: 0, seconds: 1}",
            "28: measured.comms[0].bytes: 0 is out of range; expected bytes in (0, 1e+18]");
    refused(28, "    - {kind: all_reduce, ranks: 8, bytes: 1, seconds: 1}\n    - {kind: all_reduce, ranks: 8, bytes: 1.0, seconds: 2}",
            "29: measured.comms[1]: the same kind, ranks and bytes as line 28");
    refused(25, "  op:", "25: measured.op: unknown key; expected ops or comms");
    refused(28, "    x: 1", "27: measured.comms: expected a list of {kind, ranks, bytes, seconds}");
}

/* ---- finding profiles ---- */

static void test_names_search_the_path_and_unknown_names_list_the_shipped(void **state) {
    (void)state;
    hw_profile hw;
    char path[256];
    unsetenv("CTITAN_HARDWARE_PATH");
    assert_int_equal(hw_profile_load("h1000", &hw), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "hardware 'h1000': no profile by that name"));
    assert_non_null(strstr(ct_last_error(), "known names: a100-80gb, b200, h100-sxm, h200"));
    assert_int_equal(hw_profile_load("h100 sxm", &hw), CT_ERR_INVALID);
    assert_non_null(strstr(ct_last_error(), "neither a profile name"));
    assert_int_equal(hw_profile_load("/nonexistent/x.yaml", &hw), CT_ERR_INVALID);
    assert_string_equal(ct_last_error(),
                        "/nonexistent/x.yaml: cannot open hardware profile: No such file or directory");
    /* $CTITAN_HARDWARE_PATH comes before the shipped folder */
    assert_int_equal(load_variant(1, "name: \"Power-capped H100\"", &hw, path), 0);
    hw_profile_free(&hw);
    char mine[256];
    snprintf(mine, sizeof mine, "%s/h100-sxm.yaml", dir);
    assert_int_equal(rename(path, mine), 0);
    char env[300];
    snprintf(env, sizeof env, "/nonexistent::%s", dir);
    setenv("CTITAN_HARDWARE_PATH", env, 1);
    if (hw_profile_load("h100-sxm", &hw)) fail_msg("%s", ct_last_error());
    assert_string_equal(hw.name, "Power-capped H100");
    hw_profile_free(&hw);
    char list[1024];
    hw_profile_list(list, sizeof list);
    assert_non_null(strstr(list, "a100-80gb, b200, h100-sxm, h200")); /* listed once */
    unlink(mine);
    unsetenv("CTITAN_HARDWARE_PATH");
}

/* ---- measurements ---- */

static void test_measured_ops_match_exactly_and_comms_interpolate(void **state) {
    (void)state;
    plan_measured_op ops[] = {{RT_OP_GEMM, {8192, 4096, 4096, 0}, PLAN_BF16, {1e-3, 2e-3}},
                              {RT_OP_GEMM, {8192, 4096, 4096, 0}, PLAN_FP8, {6e-4, 1.2e-3}},
                              {RT_OP_RMSNORM, {8192, 4096, 0, 0}, PLAN_F32, {5e-5, 1e-4}}};
    plan_measured_comm comms[] = {{CT_COLL_ALL_GATHER, 8, 4e6, 25e-6}, {CT_COLL_ALL_GATHER, 8, 1e6, 10e-6},
                                  {CT_COLL_ALL_GATHER, 8, 16e6, 85e-6}, {CT_COLL_ALL_GATHER, 4, 1e6, 7e-6},
                                  {CT_COLL_ALL_REDUCE, 8, 1e6, 30e-6}};
    hw_profile hw = {.ops = ops, .n_ops = 3, .comms = comms, .n_comms = 5};
    int64_t gemm[4] = {8192, 4096, 4096, 0}, other[4] = {8192, 4096, 4096, 1}, norm[4] = {8192, 4096, 0, 0};
    assert_true(hw_measured_op(&hw, RT_OP_GEMM, gemm, PLAN_BF16, 0) == 1e-3);
    assert_true(hw_measured_op(&hw, RT_OP_GEMM, gemm, PLAN_BF16, 1) == 2e-3);
    assert_true(hw_measured_op(&hw, RT_OP_GEMM, gemm, PLAN_FP8, 1) == 1.2e-3);
    assert_true(hw_measured_op(&hw, RT_OP_GEMM, gemm, PLAN_F32, 0) == -1);
    assert_true(hw_measured_op(&hw, RT_OP_GEMM, other, PLAN_BF16, 0) == -1);
    assert_true(hw_measured_op(&hw, RT_OP_RMSNORM, norm, PLAN_F32, 0) == 5e-5);
    assert_true(hw_measured_op(&hw, RT_OP_LAYERNORM, norm, PLAN_F32, 0) == -1);
    /* measured sizes exactly; between two, the line through them; below, the smallest's time;
     * above, the largest's bandwidth */
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 4e6) == 25e-6);
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 1e6) == 10e-6);
    assert_true(fabs(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 2.5e6) - 17.5e-6) < 1e-15);
    assert_true(fabs(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 10e6) - 55e-6) < 1e-15);
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 1e3) == 10e-6);
    assert_true(fabs(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 32e6) - 170e-6) < 1e-15);
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 4, 2e6) == 14e-6);
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 8, 0) == 0);
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_GATHER, 2, 1e6) == -1);
    assert_true(hw_measured_comm(&hw, CT_COLL_REDUCE_SCATTER, 8, 1e6) == -1);
    assert_true(hw_measured_comm(&hw, CT_COLL_ALL_REDUCE, 8, 3e6) == 90e-6);
    hw_profile none = {0};
    assert_true(hw_measured_op(&none, RT_OP_GEMM, gemm, PLAN_BF16, 0) == -1);
    assert_true(hw_measured_comm(&none, CT_COLL_ALL_REDUCE, 8, 1e6) == -1);
}

static int setup(void **state) {
    (void)state;
    return tmpdir_make("hw");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_profiles_have_their_datasheet_numbers),
        cmocka_unit_test(test_write_then_load_is_exact),
        cmocka_unit_test(test_write_refuses_what_load_would_refuse),
        cmocka_unit_test(test_bad_values_name_line_and_key),
        cmocka_unit_test(test_bad_structure_names_line_and_key),
        cmocka_unit_test(test_bad_measurements_name_line_and_key),
        cmocka_unit_test(test_names_search_the_path_and_unknown_names_list_the_shipped),
        cmocka_unit_test(test_measured_ops_match_exactly_and_comms_interpolate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
