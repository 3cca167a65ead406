from benchmarks.distributed import main

main()
