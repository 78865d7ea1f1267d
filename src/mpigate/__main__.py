from mpigate.cli import main

main()
