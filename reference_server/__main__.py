from reference_server.cli import main

main()
