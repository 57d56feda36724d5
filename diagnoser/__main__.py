from diagnoser.cli import main

main(prog_name="servediag")
