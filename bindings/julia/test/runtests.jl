# Tests of the Julia binding: the struct mirrors against sx_layout.json (SX_LAYOUT_JSON),
# errors, and a 4-rank training over local:// with threads (run with julia --threads=4).
using Test
using SX

const MIRRORS = Dict("sx_group_config_t" => SX.GroupConfig, "sx_param_group_desc_t" => SX.ParamGroupDesc,
                     "sx_param_desc_t" => SX.ParamDesc, "sx_view_t" => SX.View,
                     "sx_step_options_t" => SX.StepOptions, "sx_step_result_t" => SX.StepResult,
                     "sx_loss_scaling_t" => SX.LossScaling,
                     "sx_memory_stats_t" => SX.MemoryStats, "sx_param_info_t" => SX.ParamInfo,
                     "sx_unit_info_t" => SX.UnitInfo, "sx_save_options_t" => SX.SaveOptions,
                     "sx_load_options_t" => SX.LoadOptions,
                     "sx_unit_ready_options_t" => SX.UnitReadyOptions)

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
