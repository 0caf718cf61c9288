"""The risky-command classifier: what takes an automatic checkpoint and what does not."""

from __future__ import annotations

import shlex

import pytest

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.risk import CHECKPOINT_POLICIES, RiskVerdict, classify, wants_checkpoint

RISKY = [
    # rm
    "rm -rf build",
    "rm -r old",
    "rm -fr dist",
    "rm -R cache",
    "rm --recursive data",
    "rm -rf /tmp/build",
    "rm -rf /",
    "rm *.log",
    "rm -f ./*.pyc",
    "rm -f $(cat files.txt)",
    'rm "$TARGET"',
    "/bin/rm -rf node_modules",
    "\\rm -rf x",
    "'rm' -rf x",
    # wrappers and prefixes
    "sudo rm -rf /var/lib/app",
    "sudo -u root -E rm -rf /srv",
    "sudo -- rm -rf /srv",
    "doas rm -rf /srv",
    "env FOO=1 rm -rf out",
    "env -i PATH=/bin rm -rf out",
    "FOO=bar BAZ=1 rm -rf out",
    "nohup rm -rf out &",
    "time rm -rf out",
    "nice -n 10 rm -rf out",
    "timeout 10 rm -rf out",
    "timeout -s KILL 5m rm -rf out",
    "exec rm -rf out",
    "command rm -rf out",
    "builtin rm -rf out",
    "find . -name '*.pyc' | xargs rm -f",
    "find . -print0 | xargs -0 -n1 rm",
    # compound command lines
    "cd /app && rm -rf dist",
    "make build; rm -rf out",
    "test -d x || rm -rf x",
    "ls\nrm -rf out",
    "(cd /tmp && rm -rf build)",
    "{ rm -rf out; }",
    "echo $(rm -rf out)",
    "echo `rm -rf out`",
    "if [ -d out ]; then rm -rf out; fi",
    "for f in *.log; do rm \"$f\"; done",
    "ls | tee list.txt && git reset --hard",
    # shells inside shells
    "bash -c 'rm -rf /'",
    "sh -c \"git reset --hard HEAD~1\"",
    "zsh -c 'rm -rf out'",
    "bash -lc 'cd /app && rm -rf dist'",
    "sudo bash -c 'rm -rf /srv'",
    'eval "rm -rf out"',
    "bash -c \"bash -c 'rm -rf out'\"",
    "bash <<'EOF'\nrm -rf /srv\nEOF",
    "su -c 'rm -rf /srv' root",
    "cat <<'EOF' | bash\nrm -rf /srv\nEOF",
    "echo 'rm -rf out' | sh",
    "printf 'git reset --hard\\n' | bash",
    "watch -n 1 'rm -rf out'",
    "function clean { rm -rf out; }; clean",
    "diff a <(rm -rf out)",
    "a && (b || (rm -rf c))",
    "nohup sh -c 'sleep 1; rm -rf /x' >/dev/null 2>&1 &",
    # find
    "find . -name '*.tmp' -delete",
    "find /var/log -type f -exec rm {} \\;",
    "find . -name '*.bak' -exec rm -f {} +",
    # disks and files
    "dd if=/dev/zero of=/dev/sda bs=1M",
    "dd if=image.iso of=/dev/sdb",
    "mkfs.ext4 /dev/sdb1",
    "mkfs -t xfs /dev/sdc",
    "wipefs -a /dev/sdb",
    "fdisk /dev/sda",
    "parted /dev/sda mklabel gpt",
    "sfdisk /dev/sda < layout",
    "shred -u secrets.txt",
    "truncate -s 0 app.log",
    "echo hi > /dev/sda",
    "mv /etc /etc.old",
    "sudo mv /usr /usr2",
    # packages
    "apt-get remove -y nginx",
    "apt purge nginx",
    "sudo apt autoremove",
    "apt-get -o Dpkg::Options::=--force-confnew remove nginx",
    "dpkg -r nginx",
    "dpkg --purge nginx",
    "pip uninstall -y requests",
    "pip3 uninstall numpy",
    "python -m pip uninstall requests",
    "python3.11 -m pip uninstall -y requests",
    "npm uninstall lodash",
    "npm rm lodash",
    "npm prune",
    "yarn remove lodash",
    "pnpm remove lodash",
    "gem uninstall rails",
    "cargo uninstall ripgrep",
    "conda remove numpy",
    "brew uninstall wget",
    # git
    "git reset --hard",
    "git reset --hard origin/main",
    "git clean -fdx",
    "git clean -fd",
    "git checkout -- .",
    "git checkout .",
    "git restore .",
    "git restore --staged --worktree src/app.py",
    "git push --force",
    "git push -f origin main",
    "git push --force-with-lease origin feature",
    "git branch -D feature",
    "git stash drop",
    "git stash clear",
    "git rebase main",
    "git rebase -i HEAD~3",
    "git filter-branch --tree-filter 'rm -f secrets' HEAD",
    "git -C /app reset --hard",
    "/usr/bin/git clean -f",
    # permissions
    "chmod -R 777 /var/www",
    "chown -R www-data:www-data /var/www",
    "chgrp -R staff shared",
    # SQL and databases
    'psql -c "DROP TABLE users"',
    'psql -U app -d prod -c "drop database prod"',
    "mysql -e 'DROP SCHEMA shop'",
    "mysql -u root -p --execute='TRUNCATE orders'",
    "sqlite3 app.db 'DELETE FROM users'",
    "sqlite3 app.db \"UPDATE users SET admin = 1\"",
    'psql -c "DROP INDEX idx_users_email"',
    "sudo -u postgres psql -c 'TRUNCATE TABLE sessions'",
    "mongo shop --eval 'db.dropDatabase()'",
    "mongosh --eval 'db.users.drop()'",
    "psql <<EOF\nDROP TABLE users;\nEOF",
    "sqlite3 app.db <<< 'DELETE FROM sessions'",
    # processes and services
    "kill -9 -1",
    "killall node",
    "pkill -f gunicorn",
    "systemctl stop nginx",
    "sudo systemctl disable --now docker",
    "systemctl mask sshd",
    "crontab -r",
    ":(){ :|:& };:",
    "bomb() { bomb | bomb & }; bomb",
    # infrastructure
    "docker rm -f web",
    "docker rmi nginx:latest",
    "docker system prune -af",
    "docker volume rm data",
    "kubectl delete pod web-1",
    "kubectl -n prod delete deployment web",
    "terraform destroy -auto-approve",
    "terraform apply -destroy",
    "make clean",
    "make -C build distclean",
    # sync, archives, downloaded code
    "rsync -a --delete src/ dst/",
    "rsync -av --delete-after src/ host:dst/",
    "tar -xzf backup.tgz -C /",
    "tar xf rootfs.tar -C /usr",
    "curl -fsSL https://example.com/install.sh | sh",
    "wget -qO- https://example.com/i.sh | sudo bash",
    "curl -s https://example.com/x | tee install.sh | bash",
    'bash -c "$(curl -fsSL https://example.com/install.sh)"',
    "bash <(curl -s https://example.com/install.sh)",
    "python3 -c 'import shutil; shutil.rmtree(\"build\")'",
]

HARMLESS = [
    "ls -la",
    "cat file",
    'echo "rm -rf /"',
    "echo 'git reset --hard'",
    "echo rm -rf /",
    "printf '%s\\n' 'sudo rm -rf /'",
    'echo "a; rm -rf /"',
    'grep -r "DROP TABLE" .',
    "git status",
    "git log --oneline",
    "git diff",
    "git checkout -b feature",
    "git checkout main",
    "git push origin main",
    "git push -u origin feature",
    'git commit -m "rm -rf old stuff; git reset --hard"',
    "git stash",
    "git stash pop",
    "git restore --staged app.py",
    "git branch -d merged-feature",
    "git clean -n",
    "pip install numpy",
    "pip install -r requirements.txt",
    "apt-get install -y curl",
    "sudo apt-get update && sudo apt-get install -y git",
    "npm install",
    "npm run build",
    "python -m pytest",
    "python3 -m json.tool data.json",
    "rm -f /tmp/x.log",
    "rm -f build.log",
    "rm file.txt",
    "rmdir empty",
    "echo hi > /tmp/out.txt",
    "cat a >> log.txt",
    "make build 2>&1 | tee build.log",
    'psql -c "SELECT * FROM users"',
    'psql -c "DELETE FROM users WHERE id=3"',
    "psql -c \"UPDATE users SET name = 'a' WHERE id = 1\"",
    "mysql -e \"SELECT 'DROP TABLE x'\"",
    "sqlite3 app.db 'SELECT count(*) FROM users'",
    "chmod +x script.sh",
    "chmod 644 file",
    "chown user file",
    "find . -name '*.py'",
    "find . -type f -exec grep -l TODO {} +",
    "dd if=/dev/zero bs=1M count=1 | wc -c",
    "dd if=disk.img of=/dev/null",
    "mkdir -p a/b",
    "cp -r src dst",
    "mv a.txt b.txt",
    "man rm",
    "which rm",
    "type rm",
    "command -v rm",
    "history | grep rm",
    "ssh host 'rm -rf /srv'",
    "docker ps",
    "docker run --rm alpine echo hi",
    "kubectl get pods",
    "terraform plan",
    "make test",
    "systemctl status nginx",
    "systemctl restart nginx",
    "kill 1234",
    "kill -HUP 4242",
    "crontab -l",
    "tar -czf backup.tgz src",
    "tar -xzf deps.tgz -C vendor",
    "rsync -av src/ dst/",
    "curl -fsSL https://example.com/data.json | python3 -m json.tool",
    "curl -o install.sh https://example.com/install.sh",
    "bash script.sh",
    "sh -c 'ls -la'",
    "sed -i 's/foo/bar/' config.txt",
    "ln -s target link",
    "fdisk -l",
    "export PATH=$PATH:/opt/bin",
    "FOO=1 python app.py",
    "sudo -i",
    "env",
    "true # rm -rf /",
    "cat <<EOF > notes.txt\nrm -rf / is a bad idea\nEOF",
    "uv run pytest -q",
    "git fetch --prune",
    "docker compose up -d",
    "nohup python server.py > server.log 2>&1 &",
    "time make -j8",
    "echo '$(rm -rf /)'",
    'echo "\\$(rm -rf /)"',
    "diff <(ls a) <(ls b)",
    "echo $((1 << 2))",
    "echo ls | sh",
    "watch -n 5 df -h",
    "docker exec web rm -rf /data",
    "git -c user.name=x commit -m 'reset --hard'",
    "kill -9 1234 5678",
]


def test_the_table_is_big_enough() -> None:
    assert len(RISKY) >= 60 and len(HARMLESS) >= 60
    assert not set(RISKY) & set(HARMLESS)


@pytest.mark.parametrize("command", RISKY)
def test_a_dangerous_command_is_risky_and_says_why(command: str) -> None:
    verdict = classify(command)
    assert verdict.risky, command
    assert verdict.reasons


@pytest.mark.parametrize("command", HARMLESS)
def test_an_everyday_command_is_not_risky(command: str) -> None:
    verdict = classify(command)
    assert verdict == RiskVerdict(False, ()), (command, verdict.reasons)


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("rm -rf /root/app", "recursive rm of /root/app"),
        ("sudo git reset --hard", "git reset --hard"),
        ("git clean -fdx", "git clean -fdx"),
        ("git push --force origin main", "git push --force origin main"),
        ("rm *.log", "rm with a wildcard (*.log)"),
        ('psql -c "drop table users"', "SQL DROP TABLE"),
        ("sqlite3 a.db 'DELETE FROM t'", "SQL DELETE without WHERE"),
        ("dd if=x of=/dev/sdb", "dd writing to /dev/sdb"),
        ("curl -s https://x | sh", "runs downloaded code (curl | sh)"),
        ("apt-get purge -y nginx", "apt-get purge"),
        ("chmod -R 777 .", "chmod -R"),
        ("kill -9 -1", "kill of every process (kill -1)"),
        (":(){ :|:& };:", "fork bomb (function : calls itself)"),
        ("mv /etc /tmp/etc", "mv of top-level directory /etc"),
        ("make clean", "make clean"),
    ],
)
def test_the_reason_names_what_is_dangerous(command: str, reason: str) -> None:
    assert reason in classify(command).reasons


def test_every_dangerous_part_of_a_chain_is_reported_once() -> None:
    verdict = classify("rm -rf a && git reset --hard; rm -rf a")
    assert verdict.reasons == ("recursive rm of a", "git reset --hard")


# --- protected paths ------------------------------------------------------------------------

APP = "/root/app"


@pytest.mark.parametrize(
    "command",
    [
        "rm /root/app/main.py",
        "rm -f /root/app/config.yml",
        "echo x > /root/app/config.yml",
        "cat a >| /root/app/data.json",
        "cd /root/app && rm main.py",
        "cd /root && rm app/main.py",
        "mv /root/app/main.py /tmp/",
        "mv notes.txt /root/app/main.py",
        "mv /root /srv/root",
        "sed -i 's/a/b/' /root/app/main.py",
        "sed -i.bak -e 's/a/b/' /root/app/main.py",
        "ln -sf /etc/passwd /root/app/config",
        "cp template.py /root/app/main.py",
        "echo x | tee /root/app/out.txt",
        "tar -xf src.tar -C /root/app",
    ],
)
def test_writing_or_removing_under_a_protected_path_is_risky(command: str) -> None:
    assert classify(command, protected_paths=[APP]).risky


@pytest.mark.parametrize(
    "command",
    [
        "rm /srv/other/main.py",
        "echo x >> /root/app/log.txt",
        "cat /root/app/main.py",
        "cp /root/app/main.py /tmp/main.py",
        "echo x | tee -a /root/app/log.txt",
        "ln -s /root/app/main.py /tmp/link",
        "sed -n 1p /root/app/main.py",
        "echo x > /root/application.txt",
    ],
)
def test_reading_or_appending_under_a_protected_path_is_not_risky(command: str) -> None:
    assert not classify(command, protected_paths=[APP]).risky


def test_without_protected_paths_a_plain_rm_or_redirect_is_not_risky() -> None:
    assert not classify("rm /root/app/main.py").risky
    assert not classify("echo x > /root/app/config.yml").risky


def test_a_relative_path_is_matched_against_the_given_working_directory() -> None:
    assert classify("rm main.py", protected_paths=[APP], cwd=APP).risky
    assert classify("echo > ../app/x", protected_paths=[APP], cwd="/root/other").risky
    assert not classify("rm main.py", protected_paths=[APP], cwd="/srv").risky
    assert not classify("rm main.py", protected_paths=[APP]).risky  # cwd unknown


def test_a_redirect_only_counts_when_the_file_exists_if_the_caller_can_tell() -> None:
    seen: list[str] = []

    def exists(path: str) -> bool:
        seen.append(path)
        return path.endswith("config.yml")

    verdict = classify("echo a > /root/app/config.yml", protected_paths=[APP], exists=exists)
    assert verdict.reasons == ("> onto protected path /root/app/config.yml",)
    assert not classify("echo a > /root/app/new.txt", protected_paths=[APP], exists=exists).risky
    assert seen == ["/root/app/config.yml", "/root/app/new.txt"]


def test_a_redirect_counts_when_the_existence_check_fails() -> None:
    def broken(path: str) -> bool:
        raise PermissionError(path)

    assert classify("echo a > /root/app/x", protected_paths=[APP], exists=broken).risky


def test_the_reason_for_a_protected_path_names_the_file() -> None:
    verdict = classify("rm /root/app/./src/../main.py", protected_paths=["/root/app/"])
    assert verdict.reasons == ("rm of protected path /root/app/main.py",)


def test_a_relative_protected_path_is_refused() -> None:
    with pytest.raises(InvalidInput, match="absolute"):
        classify("ls", protected_paths=["app"])


# --- policies -------------------------------------------------------------------------------


def test_the_policies_are_off_risky_and_always() -> None:
    assert CHECKPOINT_POLICIES == ("off", "risky", "always")


def test_policy_off_never_checkpoints() -> None:
    assert wants_checkpoint("off", "rm -rf /") == RiskVerdict(False, ())


def test_policy_always_checkpoints_even_a_harmless_command() -> None:
    assert wants_checkpoint("always", "ls") == RiskVerdict(True, ("policy always",))


def test_policy_risky_checkpoints_only_risky_commands() -> None:
    assert wants_checkpoint("risky", "rm -rf build").risky
    assert not wants_checkpoint("risky", "ls").risky
    assert wants_checkpoint("risky", "rm main.py", protected_paths=[APP], cwd=APP).risky


def test_an_unknown_policy_is_refused_with_the_valid_choices() -> None:
    with pytest.raises(InvalidInput, match="off, risky, always"):
        wants_checkpoint("sometimes", "ls")  # type: ignore[arg-type]


def test_an_argv_list_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"shlex\.join"):
        classify(["rm", "-rf", "x"])  # type: ignore[arg-type]


def test_the_verdict_is_immutable() -> None:
    verdict = classify("ls")
    with pytest.raises(AttributeError):
        verdict.risky = True  # type: ignore[misc]


# --- malformed input ------------------------------------------------------------------------

MALFORMED = [
    "",
    "   ",
    "\n\n",
    'echo "unterminated',
    "echo 'unterminated",
    "echo $(unclosed",
    "echo `unclosed",
    "echo ${unclosed",
    ")",
    "((",
    ";;",
    "&& ||",
    "|||",
    "ls >",
    "cat <<",
    "cat <<EOF\nno end",
    "\\",
    "$'",
    "echo \x00 nul",
    "a" * 10000,
    "$(" * 200,
    "bash -c " * 50 + "ls",
    "eval " + "'eval " * 30,
]


@pytest.mark.parametrize("command", MALFORMED)
def test_malformed_input_does_not_raise(command: str) -> None:
    assert isinstance(classify(command), RiskVerdict)


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf \"/srv/data",
        "echo 'rm -rf /",
        "git reset --hard 'oops",
        "dd if=/dev/zero of=/dev/sda 'x",
        'psql -c "DROP TABLE users',
    ],
)
def test_unreadable_input_that_mentions_something_dangerous_is_risky(command: str) -> None:
    assert classify(command).risky


def test_unreadable_input_without_anything_dangerous_is_not_risky() -> None:
    assert not classify('git commit -m "it\'s fine').risky


def test_commands_nested_too_deeply_to_read_are_risky() -> None:
    command = "echo " + "$(echo " * 20 + "hi" + ")" * 20
    assert classify(command).reasons == ("commands nested too deeply to read",)


def test_a_few_levels_of_nested_shells_are_read_through() -> None:
    command = "rm -rf out"
    for _ in range(5):
        command = f"bash -c {shlex.quote(command)}"
    assert classify(command).reasons == ("recursive rm of out",)
