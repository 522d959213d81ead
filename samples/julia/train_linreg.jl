# The bindings' sample in Julia: a linear regression trained by 4 ranks (threads of this
# process; run with julia --threads=4) with ZeRO-2 AdamW. samples/LINREG.md specifies
# every number, so the losses match the C reference (samples/c/train_linreg.c) bit for
# bit and checkpoints can be exchanged with the other languages' samples.
#
# usage: julia --threads=4 --project=bindings/julia samples/julia/train_linreg.jl [--steps N] [--save DIR] [--load DIR]
using Printf
using SX

const RANKS, OUT, IN, BATCH = 4, 8, 16, 4

mutable struct Rng  # the 64-bit LCG of LINREG.md
    state::UInt64
end
function next!(r::Rng)
    r.state = r.state * 0x5851f42d4c957f2d + 0x14057b7ef767814f  # wraps mod 2^64
    Float64(r.state >> 11) * 2.0^-53 * 2.0 - 1.0
end

function run_rank(rank, opts, rendezvous, print_lock)
    teacher = Rng(7)
    tw = [next!(teacher) for j in 1:IN, i in 1:OUT]  # tw[j, i] = W*[i][j], drawn row-major
    tb = [next!(teacher) for i in 1:OUT]
    with_group(rendezvous, rank, RANKS; stage=2, backend=SX.SX_BACKEND_CPU, num_threads=1) do g
        add_param_group!(g, :adamw; lr=0.05)
        add_param!(g, "w", (OUT, IN); unit=0)
        add_param!(g, "b", (OUT,); unit=1)
        finalize!(g)
        w, b = param_view(g, "w"), param_view(g, "b")  # w is IN x OUT: w[j, i] = w[i][j]
        dw, db = grad_view(g, "w"), grad_view(g, "b")
        step = UInt64(0)
        if opts[:load] !== nothing
            load!(g, opts[:load])
            blob = read_user_blob(opts[:load])
            length(blob) == 8 || error("$(opts[:load]): user blob is $(length(blob)) bytes, expected 8")
            step = reinterpret(UInt64, blob)[1]  # little-endian u64
        else
            init = Rng(1)
            for i in 1:OUT, j in 1:IN
                w[j, i] = Float32(0.1 * next!(init))
            end
            for i in 1:OUT
                b[i] = Float32(0.1 * next!(init))
            end
        end
        for _ in 1:opts[:steps]
            gw, gb, loss = zeros(IN, OUT), zeros(OUT), 0.0
            data = Rng(step * 4096 + UInt64(rank) * 64 + 1)
            for _ in 1:BATCH
                x = [next!(data) for _ in 1:IN]
                for i in 1:OUT
                    y, t = Float64(b[i]), tb[i]
                    for j in 1:IN
                        y += Float64(w[j, i]) * x[j]
                        t += tw[j, i] * x[j]
                    end
                    diff = y - t
                    loss += diff * diff / (OUT * BATCH)
                    d = 2.0 * diff / (OUT * BATCH)
                    for j in 1:IN
                        gw[j, i] += d * x[j]
                    end
                    gb[i] += d
                end
            end
            dw .= Float32.(gw)
            db .= Float32.(gb)
            if rank == 0
                lock(print_lock) do
                    @printf("step %d loss %.6f bits %016x\n", step, loss, reinterpret(UInt64, loss))
                    flush(stdout)
                end
            end
            step!(g)
            step += 1
        end
        if opts[:save] !== nothing
            save(g, opts[:save]; user_blob=collect(reinterpret(UInt8, [step]))) do f
                wait(f)
            end
            rank == 0 && (println("saved ", opts[:save]); flush(stdout))
        end
    end
end

function main(args)
    opts = Dict{Symbol,Any}(:steps => 20, :save => nothing, :load => nothing)
    k = 1
    while k <= length(args)
        if args[k] in ("--steps", "--save", "--load") && k < length(args)
            key = Symbol(args[k][3:end])
            opts[key] = key == :steps ? parse(Int, args[k+1]) : args[k+1]
            k += 2
        else
            println(stderr, "usage: train_linreg.jl [--steps N] [--save DIR] [--load DIR]")
            exit(2)
        end
    end
    Threads.nthreads() >= RANKS || error("run with julia --threads=$RANKS: each rank needs a thread")
    rendezvous = "local://linreg-$(getpid())"
    print_lock = ReentrantLock()
    tasks = [Threads.@spawn run_rank(r, opts, rendezvous, print_lock) for r in 0:RANKS-1]
    failed = false
    for (r, t) in enumerate(tasks)
        try
            wait(t)
        catch e
            println(stderr, "rank $(r - 1): ", e isa TaskFailedException ? e.task.exception : e)
            failed = true
        end
    end
    exit(failed ? 1 : 0)
end

main(ARGS)
