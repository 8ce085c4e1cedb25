/* train_gpt_3d.c - 3-D parallelism: the GPT on DP x PP x TP ranks, and their process groups.

   pdp_mesh_create lays the ranks out as a grid, rank = (d pp + s) tp + t (a TP group, the
   most traffic, on neighbours), a communicator per dimension: over TP each block is split by
   heads (tp.h), over PP the blocks are cut into stages (pp.h), over DP each stage's gradients
   are averaged. Rank 0 first trains the GPT on one device: both losses each step (exit status
   1 if they differ by more than 1e-5); then each rank's groups, memory, bytes a step and
   bubble beside the formulas.
   Build:  cc -std=c99 -O2 -march=native -I. examples/train_gpt_3d.c -o train_gpt_3d -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_gpt_3d.c -o gpt_3d_mpi -lm
   Run:    ./train_gpt_3d              (2 x 2 x 2: 8 thread ranks; PDP_SHORT=1: 3 steps)
           ./train_gpt_3d -schedule interleaved -chunks 2    (v model chunks a stage)
           mpirun -np 8 ./gpt_3d_mpi -backend mpi     (make mpi-test checks its losses)
   Output (PDP_SHORT=1): "step 3  loss 4.894898  one device 4.894899 ...", "equal to one device
           within 1e-05", then "rank 5 (DP 1, PP 0, TP 1): DP {1 5}  PP {5 7}  TP {4 5}", its
           memory, "TP 655360 (2(t-1)/t x 2 m R b T C 4 = 655360, ...)", DP's, PP's, its bubble.
   Next:   pdp.h's manual, DISTRIBUTED, "Combinations" (the same groups and formulas). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pdp_gpt_desc g = {.vocab = 256, .context = 32, .layers = 4, .heads = 4, .dim = 64};
static int dp = 2, tp = 2, pp = 2, micro = 4, chunks = 0, steps = 20, sched, bad; /* 1f1b */
static int64_t seed = 1;
static const char *backend = "local";
static const pdp_optim_desc od = {.kind = PDP_OPTIM_ADAMW, .lr = 3e-3, .weight_decay = 0.1};
static float one[1000]; /* the single-device losses */
static pdp_token_dataset *ds;

/* The global batch of step s, the same on every rank: B windows of T + 1 tokens. */
static pdp_status batch(int s, int64_t B, int32_t *x, int32_t *y)
{
    pdp_rng r;
    pdp_rng_seed(&r, (uint64_t)seed, (uint64_t)s);
    return pdp_token_dataset_sample(ds, PDP_SPLIT_TRAIN, &r, B, x, y);
}

static pdp_status one_device(int64_t B, int32_t *x, int32_t *y) /* the reference */
{
    pdp_model *m;
    pdp_optim *o;
    pdp_tensor xt;
    PDP_TRY(pdp_gpt_create(&m, &g));
    PDP_TRY(pdp_optim_create(&o, m, &od));
    PDP_TRY(pdp_tensor_wrap_ids(x, pdp_cpu(), 2, (int64_t[]){B, g.context}, &xt));
    for (int s = 0; s < steps; s++) {
        PDP_TRY(batch(s, B, x, y));
        PDP_TRY(pdp_model_forward_backward(m, &xt, y, &one[s]));
        PDP_TRY(pdp_clip_grad_norm(m, 1.0f, NULL));
        PDP_TRY(pdp_optim_step(o));
        pdp_optim_zero_grad(o);
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    return PDP_OK;
}

static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    enum { DP, PP, TP }; /* the mesh's dimensions, outermost first */
    int64_t B = (int64_t)dp * micro * 2, b = 2; /* b: windows a micro-batch */
    int32_t *x = malloc((size_t)(B * g.context) * 2 * sizeof *x), *y = x + B * g.context;
    pdp_mesh *mesh; /* the grid of ranks, and this rank's group along each dimension */
    pdp_model *full;
    pdp_pp *p;
    pdp_optim *o;
    pdp_tensor xt;
    double worst = 0;
    char groups[256], report[1024];
    (void)user;
    if (!x) return PDP_ERR_OUT_OF_MEMORY;
    PDP_TRY(pdp_mesh_create(&mesh, ctx->world, 3, (int[]){dp, pp, tp}, /* fails unless the */
                            (const char *[]){"DP", "PP", "TP"}));    /* world has dp pp tp */
    int d = pdp_mesh_coord(mesh, DP), s = pdp_mesh_coord(mesh, PP), t = pdp_mesh_coord(mesh, TP);
    if (ctx->rank == 0) { /* the others wait meanwhile */
        printf("seed %lld: %s, backend %s, DP %d x TP %d x PP %d = %d ranks, schedule %s, %d "
               "micro-batches of %lld, GPT %d blocks, dim %d, context %d\n", (long long)seed,
               ds->source, backend, dp, tp, pp, ctx->world_size,
               (const char *[]){"1f1b", "gpipe", "interleaved"}[sched], micro, (long long)b,
               g.layers, (int)g.dim, (int)g.context);
        PDP_TRY(one_device(B, x, y));
    }
    pdp_gpt_desc gd = g;
    gd.tp = tp > 1 ? pdp_mesh_group(mesh, TP) : NULL;
    PDP_TRY(pdp_gpt_create(&full, &gd)); /* this TP rank's slices of every block */
    pdp_pp_desc pd = {.micro_batches = micro, .chunks = chunks, .dp = pdp_mesh_group(mesh, DP),
                      .balance = PDP_PP_BALANCE_WORK, /* FLOPs of the layers and the loss */
                      .schedule = (pdp_pp_schedule)sched};
    PDP_TRY(pdp_pp_create(&p, full, pdp_mesh_group(mesh, PP), &pd)); /* keeps stage s's blocks */
    pdp_model_free(full);
    PDP_TRY(pdp_optim_create(&o, pdp_pp_model(p), &od)); /* this stage's parameters */
    PDP_TRY(pdp_tensor_wrap_ids(x + d * (B / dp) * g.context, pdp_cpu(), 2,
                                (int64_t[]){B / dp, g.context}, &xt));
    for (int i = 0; i < steps; i++) {
        float loss;
        PDP_TRY(batch(i, B, x, y)); /* pipeline d takes rows [d B/dp, (d+1) B/dp) */
        PDP_TRY(pdp_pp_forward_backward(p, &xt, y + d * (B / dp) * g.context, &loss));
        PDP_TRY(pdp_pp_clip_grad_norm(p, 1.0f, NULL)); /* over DP, TP and PP */
        PDP_TRY(pdp_pp_step(p, o));
        /* the last stages' means (of equal label counts), averaged: the global batch's */
        loss = s == pp - 1 && t == 0 ? loss / dp : 0;
        PDP_TRY(pdp_comm_allreduce(ctx->world, &loss, 1, PDP_REDUCE_SUM, NULL));
        if (!(fabs((double)loss - one[i]) <= worst)) worst = fabs((double)loss - one[i]); /* NaN */
        if (ctx->rank == 0)
            printf("step %d  loss %.6f  one device %.6f  (difference %.1e)\n", i + 1,
                   (double)loss, (double)one[i], fabs((double)loss - one[i]));
    }
    if (ctx->rank == 0) { /* one[] is rank 0's */
        bad = !(worst <= 1e-5);
        printf("%s to one device within 1e-05 (largest difference %.1e over %d steps)\n",
               bad ? "NOT EQUAL" : "equal", worst, steps);
    }
    PDP_TRY(pdp_mesh_format(mesh, groups, sizeof groups)); /* its coordinates and groups */
    PDP_TRY(pdp_pp_rank_report(p, o, report, sizeof report)); /* memory, bytes, bubble */
    PDP_TRY(pdp_print_by_rank(ctx->world, "%s\n%s", groups, report)); /* rank 0 prints all */
    if (ctx->rank == 0) /* why a measured bubble is above, or below, the formulas */
        printf("(the formulas take stages of equal time and free hand-offs: a stage that "
               "computes less waits more%s; a stage's compute also counts its waits in TP's "
               "all-reduces, so its bubble can read below them)\n",
               sysconf(_SC_NPROCESSORS_ONLN) < ctx->world_size
               ? "; and with more ranks than cores, ranks wait for a core" : "");
    pdp_optim_free(o);
    pdp_pp_free(p);
    pdp_mesh_free(mesh);
    free(x);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    pdp_launch_desc ld = {0};
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-dp", PDP_ARG_INT, &dp, 1, 16, NULL},
        {"-tp", PDP_ARG_INT, &tp, 1, 4, NULL}, /* divides the 4 heads */
        {"-pp", PDP_ARG_INT, &pp, 1, 8, NULL}, /* at most the 8 residual regions */
        {"-schedule", PDP_ARG_CHOICE, &sched, 0, 0, "1f1b|gpipe|interleaved"}, /* enum order */
        {"-micro", PDP_ARG_INT, &micro, 1, 64, NULL}, /* micro-batches of 2 windows */
        {"-chunks", PDP_ARG_INT, &chunks, 0, 8, NULL}, /* interleaved: v; 0: its default, 2 */
        {"-steps", PDP_ARG_INT, &steps, 1, 1000, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
        {"-backend", PDP_ARG_STRING, &backend, 0, 0, "local|mpi"},
    };
    if (getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"))) steps = 3;
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    PDP_CHECK(pdp_backend_from_name(backend, &ld.backend));
    g.seed = (uint64_t)seed;
    PDP_CHECK(pdp_token_dataset_synthetic(&ds, &(pdp_token_dataset_desc){
        .context = g.context, .seed = (uint64_t)seed, .max_tokens = 1 << 16}));
    PDP_CHECK(pdp_launch(dp * tp * pp, &ld, train_rank, NULL));
    pdp_token_dataset_free(ds);
    return bad;
}
