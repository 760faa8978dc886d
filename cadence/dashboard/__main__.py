from cadence.dashboard.serve import main

main()
