# Tests of the Julia binding: the struct mirrors against sx_layout.json (SX_LAYOUT_JSON),
# errors, a 4-rank training over local:// with threads (run with julia --threads=4), and
# the whole optimizer state, weighted steps and params added after finalize.
using Sockets
using Test
using SX

const MIRRORS = Dict("sx_group_config_t" => SX.GroupConfig, "sx_param_group_desc_t" => SX.ParamGroupDesc,
                     "sx_param_desc_t" => SX.ParamDesc, "sx_view_t" => SX.View,
                     "sx_step_options_t" => SX.StepOptions, "sx_step_result_t" => SX.StepResult,
                     "sx_loss_scaling_t" => SX.LossScaling,
                     "sx_memory_stats_t" => SX.MemoryStats, "sx_param_info_t" => SX.ParamInfo,
                     "sx_unit_info_t" => SX.UnitInfo, "sx_save_options_t" => SX.SaveOptions,
                     "sx_load_options_t" => SX.LoadOptions,
                     "sx_regroup_options_t" => SX.RegroupOptions, "sx_regroup_result_t" => SX.RegroupResult,
                     "sx_unit_ready_options_t" => SX.UnitReadyOptions,
                     "sx_param_state_t" => SX.RawParamState,
                     "sx_optimizer_piece_t" => SX.RawOptimizerPiece,
                     "sx_optimizer_hyperparameter_t" => SX.OptimizerHyperparameter,
                     "sx_optimizer_desc_t" => SX.OptimizerDesc,
                     "sx_context_config_t" => SX.ContextConfig, "sx_context_stats_t" => SX.ContextStats)

# sx_layout.json is written by a C program in a fixed shape: one struct header line and
# one line per field; reading it with regexes avoids a JSON dependency.
function layout_of(json::String, cname::String)
    m = match(Regex("\"$cname\": \\{\"size\": (\\d+), \"align\": (\\d+), \"fields\": \\[(.*?)\\]\\}", "s"), json)
    m === nothing && error("$cname is not in sx_layout.json")
    fields = [(f[1], parse(Int, f[2]), parse(Int, f[3])) for f in
              eachmatch(r"\"name\": \"(\w+)\", \"offset\": (\d+), \"size\": (\d+)", m[3])]
    parse(Int, m[1]), parse(Int, m[2]), fields
end

@testset "layout" begin
    path = get(ENV, "SX_LAYOUT_JSON", "")
    if isempty(path)
        @warn "SX_LAYOUT_JSON is not set: layout test skipped"
    else
        json = read(path, String)
        for (cname, T) in MIRRORS
            size, align, fields = layout_of(json, cname)
            @test sizeof(T) == size
            @test Base.datatype_alignment(T) == align
            @test [String(n) for n in fieldnames(T)] == [f[1] for f in fields]
            for (i, (name, offset, fsize)) in enumerate(fields)
                @test fieldoffset(T, i) == offset
                @test sizeof(fieldtype(T, i)) == fsize
            end
        end
    end
    @test SX.version() >= v"1.0.0"
end

@testset "errors" begin
    err = try
        ShardGroup("local://jl-bad-$(getpid())", 5, 4)
    catch e
        e
    end
    @test err isa SXError
    @test err.status == SX.SX_ERR_INVALID_ARGUMENT
    @test occursin("rank", err.message)
    g = ShardGroup("local://jl-one-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1)
    close(g)
    close(g)  # double close is fine
    @test_throws SXError add_param!(g, "w", (4,))
end

@testset "input the C API would misread" begin
    with_group("local://jl-input-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        add_param_group!(g, :sgd)
        for shape in ((true, true), "44", (2.0, 3.0), [2.7])
            err = try
                add_param!(g, "w", shape)
            catch e
                e
            end
            @test err isa SXError && err.status == SX.SX_ERR_INVALID_ARGUMENT && occursin("shape", err.message)
        end
        err = try
            add_param!(g, "a\0b", (2,))
        catch e
            e
        end
        @test err isa SXError && occursin("NUL", err.message)
        @test add_param!(g, "w", (2, 3)) == 0
        finalize!(g)
        mktempdir() do d
            err = try
                save(g, joinpath(d, "a\0b"); synchronous=true)
            catch e
                e
            end
            @test err isa SXError && occursin("NUL", err.message)
            @test isempty(readdir(d))
        end
    end
end

@testset "Adagrad and RMSprop take their defaults" begin
    with_group("local://jl-adagrad-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        @test add_param_group!(g, :adagrad) == 0
        @test add_param_group!(g, :rmsprop; centered=true, momentum=0.5) == 1
        @test_throws SXError add_param_group!(g, :adagrad; alpha=0.5)  # RMSprop's, not Adagrad's
        add_param!(g, "w", (4,); param_group=0)
        add_param!(g, "v", (4,); param_group=1)
        finalize!(g)
        hp(i, keys...) = [SX.get_hyperparameter(g, i, k) for k in keys]
        @test hp(0, SX.SX_HP_LR, SX.SX_HP_EPS, SX.SX_HP_LR_DECAY, SX.SX_HP_INITIAL_ACCUMULATOR_VALUE) ==
              [1e-2, 1e-10, 0.0, 0.0]
        @test hp(1, SX.SX_HP_LR, SX.SX_HP_ALPHA, SX.SX_HP_EPS, SX.SX_HP_CENTERED, SX.SX_HP_MOMENTUM) ==
              [1e-2, 0.99, 1e-8, 1.0, 0.5]
    end
end

@testset "a packed unit is one block" begin
    with_group("local://jl-packed-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1, alignment=1) do g
        add_param_group!(g, :sgd; lr=0.5)
        add_param!(g, "a", (2, 3))
        add_param!(g, "b", (5,))
        finalize!(g)
        block = unit_view(g, 0)
        @test length(block) == 11
        block .= 1.0f0
        @test all(==(1.0f0), param_view(g, "b"))  # the same memory
        unit_view(g, 0; grad=true) .= 2.0f0
        step!(g)
        @test all(==(0.0f0), block)
    end
end

@testset "all_reduce!" begin
    rdv = "local://jl-allreduce-$(getpid())"
    tasks = [Threads.@spawn with_group(rdv, rank, 3; backend=SX.SX_BACKEND_CPU, num_threads=1,
                                       timeout_ms=60000) do g
                 [all_reduce!(g, [Float64(rank), -Float64(rank), 0.5], op) for op in (:sum, :mean, :max, :min)]
             end for rank in 0:2]
    for t in tasks
        @test fetch(t) == [[3.0, -3.0, 1.5], [1.0, -1.0, 0.5], [2.0, 0.0, 0.5], [0.0, -2.0, 0.5]]
    end
end

# Two ranks' contexts, each with two groups made in it by name, finalized and stepped
# once; the stats; a duplicate live name refused; the groups outlive the handle.
function context_train_once(g, n)
    add_param_group!(g, :sgd; lr=1.0)
    add_param!(g, "w", (n,))
    finalize!(g)
    grad_view(g, "w") .= 1.0f0
    r = step!(g)
    r.step, copy(vec(param_view(g, "w")))
end

@testset "contexts" begin
    rdv = "local://jl-context-$(getpid())"
    tasks = [Threads.@spawn with_context(rdv, rank, 2; backend=SX.SX_BACKEND_CPU, num_threads=1,
                                         timeout_ms=60000) do ctx
                 a = ShardGroup(ctx, "tenant-a")
                 b = ShardGroup(ctx, "tenant-b"; stage=1)
                 trained = (context_train_once(a, 16), context_train_once(b, 8))
                 with_two = context_stats(ctx)
                 duplicate = try
                     ShardGroup(ctx, "tenant-a")
                 catch e
                     e
                 end
                 close(a)
                 close(b)
                 after = context_stats(ctx)
                 kept = ShardGroup(ctx, "kept")
                 close(ctx)
                 refused = try
                     ShardGroup(ctx, "refused")
                 catch e
                     e
                 end
                 # The group goes on in the context after its handle went.
                 kept_trained = context_train_once(kept, 4)
                 close(kept)
                 (trained, with_two, duplicate, after, refused, kept_trained)
             end for rank in 0:1]
    for t in tasks
        trained, with_two, duplicate, after, refused, kept_trained = fetch(t)
        @test trained == ((1, fill(-1.0f0, 16)), (1, fill(-1.0f0, 8)))
        @test with_two.groups == 2 && with_two.groups_created == 2
        @test with_two.shared_memory && with_two.memory_bytes > 0 && with_two.transport_bytes == 0
        @test duplicate isa SXError && duplicate.status == SX.SX_ERR_INVALID_STATE
        @test after.groups == 0 && after.memory_bytes == 0 && after.groups_created == 2
        @test refused isa SXError && refused.status == SX.SX_ERR_INVALID_HANDLE
        @test kept_trained == (1, fill(-1.0f0, 4))
    end
end

@testset "norm domains: two slices clip by the whole norm" begin
    rdv = "local://jl-norm-domain-$(getpid())"
    tasks = [Threads.@spawn begin
                 g = ShardGroup("local://jl-nd-g$(rank)-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU,
                                num_threads=1, timeout_ms=60000)
                 add_param_group!(g, :sgd; lr=1.0)
                 add_param!(g, "w", [2]; split=([4], 0, 2 * rank))
                 add_param!(g, "b", [1]; replica=(rank, 2))
                 finalize!(g)
                 d = NormDomain(rdv, rank, 2; timeout_ms=60000)
                 join_norm_domain!(g, d, rank)
                 close(d)  # the group keeps the domain alive
                 grad_view(g, "w") .= rank == 0 ? Float32[3, 0] : Float32[0, 4]
                 grad_view(g, "b") .= 1.0f0
                 r = step!(g; max_grad_norm=1.0)
                 w = copy(vec(param_view(g, "w")))
                 bad = try
                     add_param!(g, "x", [4, 5]; split=([8, 5], 0, 6))
                 catch e
                     e
                 end
                 close(g)
                 (r.grad_norm, w, bad)
             end for rank in 0:1]
    outs = fetch.(tasks)
    @test outs[1][1] == outs[2][1]
    @test isapprox(outs[1][1], sqrt(26.0); atol=1e-12)
    coef = 1 / (sqrt(26.0) + 1e-6)
    @test isapprox(outs[1][2][1], -3 * coef; atol=1e-6) && isapprox(outs[2][2][2], -4 * coef; atol=1e-6)
    @test outs[1][3] isa SXError && outs[1][3].status == SX.SX_ERR_INVALID_ARGUMENT
end

@testset "non-finite gradients" begin
    with_group("local://jl-nonfinite-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        add_param_group!(g, :sgd; lr=0.5)
        add_param!(g, "w", (4,))
        finalize!(g)
        w, dw = param_view(g, "w"), grad_view(g, "w")
        w .= 1.0f0
        dw .= [1.0f0, NaN32, 1.0f0, 1.0f0]  # clipping checks the norm: skipped, and said
        r = step!(g; max_grad_norm=1.0)
        @test (r.step, r.skipped, r.nonfinite) == (0, true, true)
        @test all(==(1.0f0), w)
        dw .= [Inf32, 1.0f0, 1.0f0, 1.0f0]
        err = try
            step!(g; nonfinite=:error)
        catch e
            e
        end
        @test err isa SXError && err.status == SX.SX_ERR_NONFINITE
        @test all(==(1.0f0), w)
        dw .= 1.0f0
        r = step!(g; nonfinite=:skip)
        @test (r.step, r.skipped, r.nonfinite) == (1, false, false)
        @test all(==(0.5f0), w)
        @test param_group_steps(g, 0) == 1  # the skipped steps do not count
        @test_throws SXError param_group_steps(g, 1)
    end
end

@testset "mixed precision" begin
    with_group("local://jl-bf16-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1,
               grad_dtype=SX.SX_DTYPE_F32) do g
        add_param_group!(g, :sgd; lr=0.5)
        add_param!(g, "w", (2, 3); dtype=SX.SX_DTYPE_BF16)
        finalize!(g)
        w, dw = param_view(g, "w"), grad_view(g, "w")
        @test w isa Matrix{UInt16} && size(w) == (3, 2)  # bf16 as its raw bits
        @test dw isa Matrix{Float32}
        w .= 0x3f80  # bf16 1.0, the top half of fp32 1.0's bits; the masters start from it
        @test loss_scale(g) == 1.0
        set_loss_scaling!(g, :dynamic; init_scale=1024)
        @test loss_scale(g) == 1024.0
        # Gradients of the loss times 1024; the step divides them by it: SGD, lr 0.5
        # takes 1.0 to 0.5 (bf16 0x3f00).
        dw .= 1024.0f0
        r = step!(g)
        @test (r.step, r.skipped, r.loss_scale) == (1, false, 1024.0)
        @test all(==(0x3f00), w)
        dw[5] = Inf32  # skipped, and the scale backs off by half
        r = step!(g)
        @test (r.step, r.skipped, r.loss_scale) == (1, true, 512.0)
        @test all(==(0x3f00), w)
        err = try
            set_loss_scaling!(g, :dynamic; backoff_factor=1.5)
        catch e
            e
        end
        @test err isa SXError
        @test err.status == SX.SX_ERR_INVALID_ARGUMENT
        @test occursin("backoff_factor", err.message)
        @test loss_scale(g) == 512.0  # a refused call changes nothing
    end
    with_group("local://jl-f16-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        add_param_group!(g, :sgd; lr=0.5)
        add_param!(g, "w", (4,); dtype=SX.SX_DTYPE_F16)
        finalize!(g)
        w, dw = param_view(g, "w"), grad_view(g, "w")
        @test w isa Vector{Float16} && dw isa Vector{Float16}
        w .= Float16(1)
        dw .= Float16(1)
        @test !step!(g).skipped
        @test all(==(Float16(0.5)), w)
    end
end

function train_rank(rank, name, steps)
    losses = Float64[]
    with_group(name, rank, 4; stage=2, backend=SX.SX_BACKEND_CPU, num_threads=1, timeout_ms=60000) do g
        add_param_group!(g, :adam; lr=0.1)
        add_param!(g, "w", (3, 5))
        finalize!(g)
        w, dw = param_view(g, "w"), grad_view(g, "w")
        @assert size(w) == (5, 3)  # row-major [3, 5] seen column-major
        target = [Float64((rank + k) % 7) / 7 for k in 0:14]
        for _ in 1:steps
            diff = Float64.(vec(w)) .- target
            push!(losses, sum(diff .^ 2) / 15)
            vec(dw) .= Float32.(2 .* diff ./ 15)  # written straight into sx's buffer
            step!(g)
        end
    end
    losses
end

@testset "training over 4 ranks" begin
    if Threads.nthreads() < 4
        @warn "run with julia --threads=4 for the training test; skipped"
    else
        name = "local://jl-train-$(getpid())"
        tasks = [Threads.@spawn train_rank(r, name, 20) for r in 0:3]
        losses = fetch.(tasks)
        for l in losses
            @test l[end] < 0.5 * l[1]
        end
    end
end

@testset "units as a pipeline" begin
    # Stage 3 on one rank: views exist only while their unit is gathered; a unit signalled
    # twice is refused; the signalled step gives the plain step's params.
    function run(stage, overlap)
        g = ShardGroup("local://jl-pipe-$(getpid())-$stage-$overlap", 0, 1; stage=stage,
                       backend=SX.SX_BACKEND_CPU, num_threads=1)
        try
            add_param_group!(g, :adamw; lr=0.01)
            add_param!(g, "w", (6,); unit=0)
            add_param!(g, "b", (3,); unit=1)
            finalize!(g)
            for u in 0:1
                with_unit(g, u) do
                    param_view(g, u) .= 0.25f0
                end
            end
            for u in (1, 0)
                grad_view(g, u) .= Float32(u + 1)
                overlap && unit_grads_ready!(g, u)
            end
            step!(g)
            [with_unit(() -> copy(param_view(g, u)), g, u) for u in 0:1]
        finally
            close(g)
        end
    end
    plain = run(2, false)
    @test run(2, true) == plain
    @test run(3, true) == plain
    g = ShardGroup("local://jl-pipe-views-$(getpid())", 0, 1; stage=3, backend=SX.SX_BACKEND_CPU)
    try
        add_param_group!(g, :sgd; lr=0.1)
        add_param!(g, "w", (4,))
        finalize!(g)
        @test_throws SXError param_view(g, 0)
        gather_unit!(g, 0)
        @test length(param_view(g, 0)) == 4
        release_unit!(g, 0)
        @test_throws SXError release_unit!(g, 0)
        unit_grads_ready!(g, 0)
        @test_throws SXError unit_grads_ready!(g, 0)
        @test memory_stats(g).peak_param_bytes > 0
    finally
        close(g)
    end
end

# ----------------------------------------------------------------------------------
# Whole optimizer state, weighted steps, params added after finalize, views and the
# group's finalizer. Ranks are tasks on threads of their own over local://.
# ----------------------------------------------------------------------------------

"""`f(rank, g)` on `world` ranks, each a task with a group of its own; their results in
rank order."""
function run_ranks(f, name, world; config...)
    rdv = "local://jl-$name-$(getpid())"
    tasks = [Threads.@spawn with_group(g -> f(rank, g), rdv, rank, world; stage=2, backend=SX.SX_BACKEND_CPU,
                                       num_threads=1, timeout_ms=60000, config...) for rank in 0:world-1]
    fetch.(tasks)
end

enough_threads(world) = Threads.nthreads() >= world ||
    (@warn "run with julia --threads=$world for the tests of $world ranks; skipped"; false)

# AdamW with amsgrad (w and the scalar s) and SGD with momentum (b), in two units.
function whole_setup!(g)
    add_param_group!(g, :adamw; lr=0.01, amsgrad=true)
    add_param_group!(g, :sgd; lr=0.1, momentum=0.9)
    add_param!(g, "w", (7, 11); param_group=0, unit=0)
    add_param!(g, "b", (13,); param_group=1, unit=1)
    add_param!(g, "s", (); param_group=0, unit=1)
    finalize!(g)
end

# `steps` steps with gradients that differ per rank (`seed`), step and param; the flat
# (row-major) order is sx's.
function whole_train!(g, steps, seed)
    for s in 0:steps-1
        for i in 0:2
            grad = vec(grad_view(g, i))
            for k in eachindex(grad)
                grad[k] = Float32(((k - 1) * 7 + s * 3 + seed + i) % 11 - 5) / 8
            end
        end
        step!(g; max_grad_norm=2.0)
    end
end

same_state(a, b) = (a.index, a.name, a.step, a.momentum_steps, a.tensors) ==
                   (b.index, b.name, b.step, b.momentum_steps, b.tensors)

caught(f) = try
    f()
    nothing
catch e
    e
end

@testset "a 2 x 2 mesh (HSDP) trains as the flat group of 4" begin
    if enough_threads(4)
        function mesh_run(name, shard_size)
            rdv = "local://jl-$name-$(getpid())"
            tasks = [Threads.@spawn with_group(rdv, rank, 4; stage=2, backend=SX.SX_BACKEND_CPU, num_threads=1,
                                               timeout_ms=60000, shard_size=shard_size) do g
                         whole_setup!(g)
                         whole_train!(g, 3, rank)
                         ([copy(vec(param_view(g, i))) for i in 0:2], unit_info(g, 0))
                     end for rank in 0:3]
            fetch.(tasks)
        end
        flat = mesh_run("mesh-flat", 0)
        mesh = mesh_run("mesh-2x2", 2)
        for rank in 0:3
            # Clipping's norm is summed over other pieces: equal to fp32 rounding.
            @test all(isapprox.(mesh[rank+1][1], flat[rank+1][1]; rtol=1e-6))
            info = mesh[rank+1][2]
            @test (info.shard_size, info.shard_rank, info.replicas, info.replica_rank) ==
                  (2, rank % 2, 2, rank ÷ 2)
            @test flat[rank+1][2].shard_size == 4
        end
        err = caught(() -> ShardGroup("local://jl-mesh-bad-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU,
                                      shard_size=2))
        @test err isa SXError && occursin("shard_size 2 does not divide the world size 1", err.message)
    end
end

@testset "transport :tcp trains as :auto, bit for bit" begin
    if enough_threads(2)
        # :tcp is Gloo's TCP between ranks that are threads of this process; :auto is shared
        # memory here.
        function transport_run(name, transport)
            rdv = "local://jl-$name-$(getpid())"
            tasks = [Threads.@spawn with_group(rdv, rank, 2; stage=2, backend=SX.SX_BACKEND_CPU, num_threads=1,
                                               timeout_ms=60000, transport=transport) do g
                         whole_setup!(g)
                         whole_train!(g, 3, rank)
                         [copy(vec(param_view(g, i))) for i in 0:2]
                     end for rank in 0:1]
            fetch.(tasks)
        end
        auto = transport_run("transport-auto", :auto)
        tcp = transport_run("transport-tcp", "tcp")
        @test auto[1] == auto[2]
        @test tcp == auto
    end
    for bad in (:udp, "udp", "")
        err = caught(() -> ShardGroup("local://jl-transport-bad-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU,
                                      transport=bad))
        @test err isa SXError && err.status == SX.SX_ERR_INVALID_ARGUMENT && occursin("transport", err.message)
    end
end

@testset "each rank writes its trace" begin
    if enough_threads(2)
        dir = mktempdir()
        template = joinpath(dir, "t-%r.json")
        rdv = "local://jl-trace-$(getpid())"
        tasks = [Threads.@spawn with_group(rdv, rank, 2; backend=SX.SX_BACKEND_CPU, num_threads=1,
                                           timeout_ms=60000, trace_path=template, trace_events=1000) do g
                     add_param_group!(g, :sgd; lr=0.1)
                     add_param!(g, "w", (3, 5); unit=4)
                     finalize!(g)
                     step!(g)
                     flush_trace(g)
                     flushed = isfile(joinpath(dir, "t-$rank.json"))
                     step!(g)
                     flushed
                 end for rank in 0:1]
        @test all(fetch.(tasks))
        for rank in 0:1
            text = read(joinpath(dir, "t-$rank.json"), String)
            @test occursin("\"rank\":$rank,", text)
            @test occursin("\"capacity\":1000,", text)
            @test count("\"name\":\"sx_step\"", text) == 2
            # Each reduce-scatter and all-gather by unit id, with the buffer's bytes (15
            # floats padded to 2 x 16).
            @test count("\"unit\":4,\"bytes\":128}", text) == 4
        end
        g = ShardGroup("local://jl-trace-bad-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU,
                       trace_path="/nonexistent-sx-dir/t.json")
        err = caught(() -> flush_trace(g))
        @test err isa SXError && occursin("/nonexistent-sx-dir/t.rank0.json", err.message)
        close(g)
        err = caught(() -> ShardGroup("local://jl-trace-neg-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU,
                                      trace_events=-1))
        @test err isa SXError && occursin("trace_events", err.message)
    end
end

@testset "finalize reserves the checkpoint staging when asked" begin
    for reserve in (false, true)
        g = ShardGroup("local://jl-reserve-$(reserve)-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU,
                       reserve_checkpoint_staging=reserve)
        try
            add_param_group!(g, :adam)
            add_param!(g, "w", (1000,))
            finalize!(g)
            # Adam's values and two states, 4000 bytes each, each on a 4 KiB boundary.
            @test memory_stats(g).staging_bytes == (reserve ? 2 * 4096 + 4000 : 0)
        finally
            close(g)
        end
    end
end

# offload=true: a CUDA group on the simulated device (SX_SIMULATED_DEVICE=1: host memory
# behind a device's calls) keeps LAMB's state on the host; a CUDA group that does not
# offload keeps it, and runs LAMB, on the device. The simulated device's memory is host memory, but param_view and
# grad_view wrap host memory only: offload_floats takes the C view itself.
function offload_floats(g, i; grad=false)
    v = SX._blank(SX.View)
    SX.check(ccall((:sx_view_init, "libsx"), Int32, (Ref{SX.View}, Csize_t), v, sizeof(SX.View)))
    h = SX._handle(g)
    SX.check(grad ? ccall((:sx_grad_view, "libsx"), Int32, (Ptr{Cvoid}, Int32, Ref{SX.View}), h, i, v) :
                    ccall((:sx_param_view, "libsx"), Int32, (Ptr{Cvoid}, Int32, Ref{SX.View}), h, i, v))
    v.dtype == SX.SX_DTYPE_F32 || error("param $i's view is of dtype $(v.dtype), not fp32")
    unsafe_wrap(Array, Ptr{Float32}(v.data), Int(v.numel); own=false), v.device
end

# 2 ranks of a group of `backend` with `offload`: LAMB over one 2-D fp32 param, two steps;
# per rank the param before and after, the memory stats and the view's device.
function offload_run(name, backend, offload)
    run_ranks(name, 2; backend=backend, offload=offload) do rank, g
        add_param_group!(g, :lamb; lr=0.01)
        add_param!(g, "w", (6, 4))
        finalize!(g)
        w, device = offload_floats(g, 0)
        for k in eachindex(w)
            w[k] = Float32((k - 1) % 7 - 3) / 8
        end
        before = copy(w)
        for s in 0:1
            dw, _ = offload_floats(g, 0; grad=true)
            for k in eachindex(dw)
                dw[k] = Float32(((k - 1) * 5 + s + rank) % 9 - 4) / 16
            end
            step!(g)
        end
        (before, copy(offload_floats(g, 0)[1]), memory_stats(g), device)
    end
end

@testset "offload: a CUDA group on the simulated device steps LAMB with its state on the host" begin
    if enough_threads(2)
        withenv("SX_SIMULATED_DEVICE" => "1") do  # read when a CUDA group is created
            runs = offload_run("offload-lamb", SX.SX_BACKEND_CUDA, true)
            for (before, after, stats, device) in runs
                @test device == SX.SX_DEVICE_CUDA
                @test before != after
                @test stats.optimizer_bytes > 0
                # The params and their flat gradient buffer (fp32: as large) are on the
                # device; the masters, LAMB's state and the reduced gradient shard are not.
                @test stats.device_bytes == 2 * stats.param_bytes
                @test 0 < stats.device_bytes < stats.param_bytes + stats.grad_bytes + stats.optimizer_bytes
            end
            @test runs[1][2] == runs[2][2]  # the replicated param, the same on both ranks
            kept = offload_run("offload-none", SX.SX_BACKEND_CUDA, false)
            for (before, after, stats, device) in kept  # LAMB's state and work on the device
                @test device == SX.SX_DEVICE_CUDA
                @test before != after
                @test stats.optimizer_bytes > 0
                @test stats.device_bytes == stats.param_bytes + stats.grad_bytes + stats.optimizer_bytes
            end
            @test kept[1][2] == kept[2][2]
            for (before, after, stats, device) in offload_run("offload-cpu", SX.SX_BACKEND_CPU, true)
                @test device == SX.SX_DEVICE_CPU
                @test before != after
                @test stats.device_bytes == 0 && stats.param_bytes > 0
            end
        end
    end
end

@testset "rendezvous token: a wrong one refused, the right one admitted" begin
    port = let s = Sockets.listen(Sockets.IPv4(127, 0, 0, 1), 0)
        p = Int(Sockets.getsockname(s)[2]); close(s); p
    end
    url = "tcp://127.0.0.1:$port"
    rank0 = Threads.@spawn ShardGroup(url, 0, 2; backend=SX.SX_BACKEND_CPU, num_threads=1, timeout_ms=30000,
                                      rendezvous_token="jl-secret", rendezvous_bind="*")
    # "localhost": another spelling of the address, so that this refused attempt does not
    # count as one of this process's groups on the others' URL (key_space.cc).
    err = caught(() -> ShardGroup("tcp://localhost:$port", 1, 2; backend=SX.SX_BACKEND_CPU, num_threads=1,
                                  timeout_ms=30000, rendezvous_token="not-it"))
    @test err isa SXError && err.status == SX.SX_ERR_INVALID_ARGUMENT && occursin("does not match", err.message)
    @test !occursin("jl-secret", err.message) && !occursin("not-it", err.message)
    g1 = ShardGroup(url, 1, 2; backend=SX.SX_BACKEND_CPU, num_threads=1, timeout_ms=30000,
                    rendezvous_token="jl-secret")
    g0 = fetch(rank0)
    @test SX.world_size(g0) == 2 && SX.world_size(g1) == 2
    close(g1); close(g0)
    err = caught(() -> ShardGroup("local://jl-max-$(getpid())", 0, SX.SX_MAX_WORLD_SIZE + 1))
    @test err isa SXError && occursin("SX_MAX_WORLD_SIZE", err.message)
end

@testset "whole optimizer state: gathered from 3 ranks, scattered into 2" begin
    if enough_threads(3)
        saved = run_ranks("whole-save3", 3) do rank, g
            whole_setup!(g)
            whole_train!(g, 3, rank)
            (gather_optim_state(g; root=0), [copy(vec(param_view(g, i))) for i in 0:2])
        end
        @test saved[2][1] === nothing && saved[3][1] === nothing
        states, param_values = saved[1]
        @test [s.name for s in states] == ["w", "b", "s"]
        @test [s.index for s in states] == [0, 1, 2]
        @test sort(collect(keys(states[1].tensors))) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
        @test collect(keys(states[2].tensors)) == ["momentum_buffer"]
        @test (states[1].step, states[2].momentum_steps, states[2].param_group) == (3, 3, 1)
        @test length(states[1].tensors["exp_avg"]) == 77 && length(states[3].tensors["exp_avg"]) == 1
        @test any(!=(0f0), states[1].tensors["exp_avg"])

        by_name = Dict(s.name => s for s in states)
        back = run_ranks("whole-load2", 2) do rank, g
            whole_setup!(g)
            for (i, v) in enumerate(param_values)
                vec(param_view(g, i - 1)) .= v
            end
            scatter_optim_state!(g, rank == 1 ? by_name : nothing; root=1)
            info = param_info(g, "w")
            part = copy(state_view(g, "w", "exp_avg"))
            whole = gather_optim_state(g; root=0)
            whole_train!(g, 1, rank)  # the scattered state steps on
            (part, info.shard_begin, info.shard_end, whole)
        end
        # Each rank's part in place is the slice of the whole its shard covers.
        for (part, b, e, _) in back
            @test part == states[1].tensors["exp_avg"][b+1:e]
        end
        @test back[2][4] === nothing
        @test all(same_state(x, y) for (x, y) in zip(states, back[1][4]))
    end
end

@testset "regroup!: two survivors of three go on from a checkpoint" begin
    if enough_threads(3)
        dir = mktempdir()
        path = joinpath(dir, "step-3")
        left = Threads.Atomic{Int}(0)
        results = run_ranks("regroup3", 3) do rank, g
            whole_setup!(g)
            whole_train!(g, 3, rank)
            save(f -> wait(f), g, path; synchronous=true)
            saved = [copy(vec(param_view(g, i))) for i in 0:2]
            whole_train!(g, 1, rank)  # a step the regroup takes back
            abort!(g)
            Threads.atomic_add!(left, 1)
            while left[] < 3
                yield()
            end
            rank == 2 && return nothing  # lost
            @test lost_ranks(g) == Int[]  # threads of one process: none known to have exited
            r = regroup!(g, path; expected_world_size=2)
            (r, SX.world_size(g), saved, [copy(vec(param_view(g, i))) for i in 0:2])
        end
        @test results[3] === nothing
        for rank in 0:1
            r, world, saved, after = results[rank + 1]
            @test r == (epoch=1, rank=rank, world_size=2, shard_size=2, previous_rank=rank,
                        previous_world_size=3, step=3, from_memory=false)
            @test world == 2
            @test after == saved
        end
    end
end

@testset "regroup!: two survivors of three go on from memory copies" begin
    if enough_threads(3)
        left = Threads.Atomic{Int}(0)
        results = run_ranks("regroup3mem", 3; memory_copy_interval=1) do rank, g
            whole_setup!(g)
            whole_train!(g, 3, rank)
            saved = [copy(vec(param_view(g, i))) for i in 0:2]
            @test memory_stats(g).memory_copy_bytes > 0
            abort!(g)
            Threads.atomic_add!(left, 1)
            while left[] < 3
                yield()
            end
            rank == 2 && return nothing  # lost
            r = regroup!(g; expected_world_size=2)  # no checkpoint: the copies hold every shard
            (r, saved, [copy(vec(param_view(g, i))) for i in 0:2])
        end
        @test results[3] === nothing
        for rank in 0:1
            r, saved, after = results[rank + 1]
            @test r == (epoch=1, rank=rank, world_size=2, shard_size=2, previous_rank=rank,
                        previous_world_size=3, step=3, from_memory=true)
            @test after == saved
        end
    end
end

@testset "regroup!: a process joins three ranks" begin
    if enough_threads(4)
        dir = mktempdir()
        path = joinpath(dir, "step-3")
        rdv = "local://jl-join-$(getpid())"
        tasks = map(0:3) do rank
            Threads.@spawn begin
                if rank == 3  # the joining process: registers as the members do, then waits
                    with_group(rdv, 0, 1; stage=2, backend=SX.SX_BACKEND_CPU, num_threads=1, timeout_ms=60000,
                               join=true) do g
                        whole_setup!(g)
                        r = regroup!(g)
                        (r, [copy(vec(param_view(g, i))) for i in 0:2])
                    end
                else
                    with_group(rdv, rank, 3; stage=2, backend=SX.SX_BACKEND_CPU, num_threads=1,
                               timeout_ms=60000) do g
                        whole_setup!(g)
                        whole_train!(g, 3, rank)
                        waiting = 0
                        for _ in 1:3000
                            waiting = poll_joiners(g)
                            waiting > 0 && break
                            sleep(0.01)
                        end
                        r = regroup!(g; admit=waiting)
                        (r, [copy(vec(param_view(g, i))) for i in 0:2])
                    end
                end
            end
        end
        results = fetch.(tasks)
        for rank in 0:3
            r, after = results[rank + 1]
            @test r == (epoch=1, rank=rank, world_size=4, shard_size=4, previous_rank=rank == 3 ? -1 : rank,
                        previous_world_size=3, step=3, from_memory=true)
            @test after == results[1][2]
        end
    end
end

@testset "whole optimizer state: callbacks and their exceptions" begin
    if enough_threads(2)
        results = run_ranks("whole-callback", 2) do rank, g
            whole_setup!(g)
            whole_train!(g, 2, rank)
            seen = Tuple{String,Int,Vector{String}}[]
            gather_optim_state(g; root=1) do st
                @assert all(length(t) == st.numel for t in values(st.tensors))
                push!(seen, (st.name, st.param_group, sort(collect(keys(st.tensors)))))
            end
            before = gather_optim_state(g; root=0)
            # A Julia exception: thrown on the root, SX_ERR_CANCELLED elsewhere.
            err = caught() do
                scatter_optim_state!(g; root=0) do st
                    st.name == "b" && throw(KeyError("no state for b here"))
                    fill!(st.tensors["exp_avg"], 1f0)
                    st.step = 99
                end
            end
            after = gather_optim_state(g; root=0)
            # An SXError: its own status everywhere.
            err2 = caught() do
                scatter_optim_state!(g; root=0) do st
                    throw(SXError(SX.SX_ERR_NOT_FOUND, "nothing for $(st.name)"))
                end
            end
            after2 = gather_optim_state(g; root=0)
            whole_train!(g, 1, rank)  # the group goes on
            (seen, before, err, after, err2, after2)
        end
        three = ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
        @test results[2][1] == [("w", 0, three), ("b", 1, ["momentum_buffer"]), ("s", 0, three)]
        @test isempty(results[1][1])  # the callback ran on the root only
        @test results[1][3] isa KeyError
        @test results[2][3] isa SXError && results[2][3].status == SX.SX_ERR_CANCELLED
        @test occursin("'b'", results[2][3].message)
        before = results[1][2]
        @test all(same_state(x, y) for (x, y) in zip(before, results[1][4]))  # nothing changed
        @test results[1][5] isa SXError && results[1][5].status == SX.SX_ERR_NOT_FOUND
        @test occursin("nothing for w", results[1][5].message)
        @test results[2][5] isa SXError && results[2][5].status == SX.SX_ERR_NOT_FOUND
        @test all(same_state(x, y) for (x, y) in zip(before, results[1][6]))
    end
end

@testset "whole optimizer state: a map that does not fit, state views" begin
    if enough_threads(2)
        results = run_ranks("whole-views", 2) do rank, g
            whole_setup!(g)
            # A trainable param's unit has its state from finalize on: zero until a step.
            zero_before = all(==(0f0), state_view(g, "b", "momentum_buffer"))
            whole_train!(g, 1, rank)
            wrong = caught(() -> state_view(g, "b", "exp_avg"))
            # A tensor of the wrong length changes nothing, on every rank.
            given = gather_optim_state(g; root=0)
            short = nothing
            if rank == 0
                short = Dict(s.name => s for s in given)
                short["w"].tensors["exp_avg"] = short["w"].tensors["exp_avg"][1:76]
            end
            misfit = caught(() -> scatter_optim_state!(g, short; root=0))
            # Nothing on the root: every rank is told, none waits for the others in vain.
            nothing_on_root = caught(() -> scatter_optim_state!(g, nothing; root=0))
            # Seeds written through each rank's part show in the whole.
            state_view(g, "w", "exp_avg") .= Float32(rank + 1)
            info = param_info(g, "w")
            (zero_before, wrong, misfit, info, gather_optim_state(g; root=0), nothing_on_root)
        end
        @test all(r[6] isa SXError && r[6].status == SX.SX_ERR_INVALID_ARGUMENT for r in results)
        @test occursin("no callback or states were given on the root", results[1][6].message)
        @test all(r[1] for r in results)
        wrong = results[1][2]
        @test wrong isa SXError && wrong.status == SX.SX_ERR_INVALID_ARGUMENT && occursin("momentum_buffer", wrong.message)
        @test all(r[3] isa SXError && r[3].status == SX.SX_ERR_INVALID_ARGUMENT for r in results)
        @test occursin("'exp_avg' has 76 values; sx keeps 77", results[1][3].message)
        info, whole = results[1][4], results[1][5]
        m = whole[1].tensors["exp_avg"]
        @test 0 < info.shard_end < 77
        @test all(==(1f0), m[info.shard_begin+1:info.shard_end])
        @test all(==(2f0), m[info.shard_end+1:end])
    end
    # Packed state: an 8-bit slot's codes (UInt8) and block scales, a bf16 slot's bits (UInt16).
    with_group("local://jl-whole-packed-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        add_param_group!(g, :adamw; lr=0.01, state_dtype="8bit")
        add_param_group!(g, :adamw; lr=0.01, state_dtype=:bf16)
        add_param!(g, "w", (64, 128); param_group=0)
        add_param!(g, "c", (48, 100); param_group=1)
        finalize!(g)
        for s in 1:2
            for i in 0:1
                grad = vec(grad_view(g, i))
                grad .= Float32.(((0:length(grad)-1) .* 7 .+ s .+ i) .% 11 .- 5) ./ 8
            end
            step!(g)
        end
        codes, scales = state_view(g, "w", "exp_avg"), state_view(g, "w", "exp_avg.scale")
        @test codes isa Vector{UInt8} && length(codes) == 64 * 128
        @test scales isa Vector{Float32} && length(scales) == 32
        @test state_view(g, "c", "exp_avg_sq") isa Vector{UInt16}
        m = gather_optim_state(g)[1].tensors["exp_avg"]
        # Each block decodes its extreme to exactly its scale times an end of the signed map.
        lowest = -0.99296874f0
        @test all(maximum(m[256b+1:256b+256]) == scales[b+1] || minimum(m[256b+1:256b+256]) == lowest * scales[b+1]
                  for b in 0:31)
    end
    # A param never trainable has no state yet, but is delivered.
    with_group("local://jl-whole-frozen-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        add_param_group!(g, :adam)
        add_param!(g, "w", (5,); unit=0)
        add_param!(g, "f", (3,); unit=1, frozen=true)
        finalize!(g)
        err = caught(() -> state_view(g, "f", "exp_avg"))
        @test err isa SXError && err.status == SX.SX_ERR_INVALID_STATE
        whole = gather_optim_state(g)
        @test length(whole) == 2 && length(whole[1].tensors) == 2 && isempty(whole[2].tensors)
    end
end

# In functions of their own, so that no view outlives them in a slot of the test's frame.
@noinline function seed_through_a_view!(g)
    param_view(g, "w") .= 3f0
    nothing
end

function views_keep_the_group()
    g = ShardGroup("local://jl-loans-$(getpid())", 0, 1; backend=SX.SX_BACKEND_CPU, num_threads=1)
    add_param_group!(g, :sgd)
    add_param!(g, "w", (4,))
    finalize!(g)
    w = param_view(g, "w")
    @test SX.loans(g) == 1
    SX._finalize_group(g)  # as the GC would run it while the view is alive
    @test isopen(g)
    w .= 2f0
    w = nothing
    seed_through_a_view!(g)
    for _ in 1:10
        SX.loans(g) == 0 && break
        GC.gc()
    end
    @test SX.loans(g) == 0  # the views were collected and gave the group back
    @test all(==(3f0), copy(param_view(g, "w")))
    close(g)
    @test !isopen(g)
    @test_throws SXError state_view(g, "w", "exp_avg")  # a closed group refuses new views
end

@testset "views keep the group from its finalizer" begin
    views_keep_the_group()
end

@testset "weighted steps (uneven inputs)" begin
    if enough_threads(3)
        # Ranks hold 3, 2 and 0 samples; each adds the sum of its samples' gradients. SGD
        # with lr 1 from zero: the params become minus the mean over the 5 samples.
        got = run_ranks("weighted", 3) do rank, g
            samples = (Float32[1, 2, 3], Float32[10, 20], Float32[])[rank + 1]
            add_param_group!(g, :sgd; lr=1.0)
            add_param!(g, "w", (4,))
            finalize!(g)
            grad_view(g, "w") .= sum(samples; init=0f0)
            r = step!(g; weight=length(samples))
            w = copy(param_view(g, "w"))
            r2 = step!(g; weight=0)  # nobody has data: skipped, nothing changes
            (r.skipped, w, r2.skipped, copy(param_view(g, "w")))
        end
        for (skipped, w, skipped2, w2) in got
            @test !skipped && skipped2
            @test all(x -> isapprox(x, -36f0 / 5; rtol=1e-6), w)
            @test w2 == w
        end
        errs = run_ranks("weighted-mismatch", 2) do rank, g
            add_param_group!(g, :sgd)
            add_param!(g, "w", (4,))
            finalize!(g)
            caught(() -> step!(g; weight=rank == 0 ? 1.0 : nothing))
        end
        for e in errs
            @test e isa SXError && e.status == SX.SX_ERR_MISMATCH
            @test occursin("weighted: 1 on rank 0, 0 on rank 1", e.message)
        end
    end
end

@testset "params added after finalize" begin
    if enough_threads(2)
        got = run_ranks("late-params", 2) do rank, g
            add_param_group!(g, :sgd; lr=1.0)
            add_param!(g, "w", (4,); unit=0)
            finalize!(g)
            grad_view(g, "w") .= 1f0
            step!(g)
            late = add_param_group!(g, :sgd; lr=0.5)
            add_param!(g, "v", (3,); param_group=late, unit=1)
            early = caught(() -> param_view(g, "v"))
            err = caught(() -> step!(g))
            finalize!(g)
            grad_view(g, "v") .= 2f0
            step!(g)
            (early, err, copy(param_view(g, "w")), copy(param_view(g, "v")))
        end
        for (early, err, w, v) in got
            @test early isa SXError && early.status == SX.SX_ERR_INVALID_STATE
            @test err isa SXError && err.status == SX.SX_ERR_INVALID_STATE
            @test occursin("call sx_finalize again", err.message)
            @test w == fill(-1f0, 4) && v == fill(-1f0, 3)
        end
        errs = run_ranks("late-mismatch", 2) do rank, g
            add_param_group!(g, :sgd)
            add_param!(g, "w", (4,); unit=0)
            finalize!(g)
            add_param!(g, "v", (4, 4 + rank); unit=1)
            caught(() -> finalize!(g))
        end
        for e in errs
            @test e isa SXError && e.status == SX.SX_ERR_MISMATCH
            @test occursin("param 'v' shape: [4, 4] on rank 0, [4, 5] on rank 1", e.message)
        end
    end
end

# ----------------------------------------------------------------------------------
# Custom optimizers: Lion in Julia against the built-in Lion, bit for bit. sx calls the
# update on its own threads (Julia >= 1.9 adopts them).
# ----------------------------------------------------------------------------------
function jl_lion(p::OptimizerPiece)
    lr, beta1, beta2, wd = p.hyperparameters
    decay, neg_lr = Float32(1.0 - lr * wd), Float32(-lr)
    b1, omb1, b2, omb2 = Float32(beta1), Float32(1.0 - beta1), Float32(beta2), Float32(1.0 - beta2)
    m = p.state[1]
    @inbounds for i in eachindex(p.param)
        g = p.grad[i] * p.grad_scale
        x = p.param[i] * decay
        c = m[i] * b1 + omb1 * g  # Julia never fuses into an FMA unless asked (muladd, @fastmath)
        p.param[i] = x + neg_lr * (c > 0 ? 1f0 : c < 0 ? -1f0 : 0f0)
        m[i] = m[i] * b2 + omb2 * g
    end
    nothing
end

const JL_LION = register_optimizer(jl_lion, "jl_lion", ["exp_avg"];
                                   hyperparameters=("lr" => 1e-4, "beta1" => 0.9, "beta2" => 0.99,
                                                    "weight_decay" => 0.0))

@testset "custom optimizers: Lion in Julia is the built-in Lion" begin
    @test JL_LION >= SX.SX_OPTIM_CUSTOM_FIRST
    for world in (1, 2)
        world > 1 && !enough_threads(world) && continue
        got = run_ranks("custom-lion-$world", world) do rank, g
            builtin = add_param_group!(g, :lion; lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1)
            mine = add_param_group!(g, JL_LION; lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1)
            for (k, shape) in enumerate(((37, 53), (7,)))
                add_param!(g, "p$k.builtin", shape; param_group=builtin, unit=0)
                add_param!(g, "p$k.custom", shape; param_group=mine, unit=1)
            end
            finalize!(g)
            for k in 1:2, suffix in ("builtin", "custom")
                w = vec(param_view(g, "p$k.$suffix"))
                w .= Float32.(cos.(0:length(w)-1))
            end
            for s in 0:19
                if s == 10
                    SX.set_lr!(g, builtin, 1e-3)
                    SX.set_lr!(g, mine, 1e-3)
                end
                for k in 1:2, suffix in ("builtin", "custom")
                    dw = vec(grad_view(g, "p$k.$suffix"))
                    dw .= Float32.(sin.((0:length(dw)-1) .* 0.37 .+ s * 1.3 .+ rank * 0.5) .* (1 + s % 3))
                end
                step!(g; max_grad_norm=5.0)
            end
            [(copy(param_view(g, "p$k.builtin")), copy(param_view(g, "p$k.custom"))) for k in 1:2]
        end
        for pairs in got, (a, b) in pairs
            @test reinterpret(UInt32, vec(a)) == reinterpret(UInt32, vec(b))
        end
    end
    # Bad descriptions: no update, a repeated slot, a taken name.
    e = caught(() -> register_optimizer(nothing, "jl_bad_update", ["m"]))
    @test e isa SXError && e.status == SX.SX_ERR_INVALID_ARGUMENT
    e = caught(() -> register_optimizer(jl_lion, "jl_bad_slots", ["m", "m"]))
    @test e isa SXError && e.status == SX.SX_ERR_INVALID_ARGUMENT && occursin("m", e.message)
    e = caught(() -> register_optimizer(jl_lion, "jl_lion", ["exp_avg"]))
    @test e isa SXError && e.status == SX.SX_ERR_ALREADY_EXISTS
end
