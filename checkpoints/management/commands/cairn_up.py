"""Start the whole embedded product: web server, Celery worker with the beat scheduler."""

import os
import signal
import subprocess
import sys
import time

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the web server, a Celery worker and the scheduler together until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000")
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args, addr, concurrency, **options):
        python = sys.executable
        commands = {
            "web": [python, "manage.py", "runserver", addr, "--noreload"],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "cairn",
                "worker",
                "--beat",
                "--loglevel",
                "INFO",
                "--concurrency",
                str(concurrency),
                "--hostname",
                f"cairn-embedded-{os.getpid()}@%h",
            ],
        }
        processes = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
        self.stdout.write(f"Cairn is up on http://{addr}/ (Ctrl-C stops everything).")
        try:
            while all(p.poll() is None for p in processes.values()):
                time.sleep(0.5)
            stopped = [n for n, p in processes.items() if p.poll() is not None]
            self.stderr.write(f"{', '.join(stopped)} stopped; shutting the rest down.")
        except KeyboardInterrupt:
            pass
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes.values():
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
