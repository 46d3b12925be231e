# bash completion for ckptctl: commands, options and their values, job names and steps (asked of
# the daemon with `ckptctl ls`, through the same --socket as the command line), directories for
# export. Install: source it from ~/.bashrc, or copy it to
# /usr/share/bash-completion/completions/ckptctl.

_ckptctl_ask() {
  # The first column of `ckptctl [--socket S] ls [JOB]` without its header; nothing on error.
  local ctl="$1"; shift
  "$ctl" "${_ckptctl_socket[@]}" ls "$@" 2>/dev/null | awk 'NR > 1 && NF { print $1 }'
}

_ckptctl() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
  local ctl="${COMP_WORDS[0]}"
  local commands="ls du status watch inspect rm latest wait reshard abort gc prefetch export verify"
  _ckptctl_socket=()
  local cmd="" i args=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    local w="${COMP_WORDS[i]}"
    case "$w" in
      --socket) _ckptctl_socket=(--socket "${COMP_WORDS[i+1]}"); ((i++)) ;;
      --timeout_ms|--until|--target_job|--format|--max_file_bytes|--interval_ms|--sample|--seed|--tier) ((i++)) ;;
      -*) ;;
      *) if [[ -z "$cmd" ]]; then cmd="$w"; else args+=("$w"); fi ;;
    esac
  done
  case "$prev" in
    --socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --until) COMPREPLY=($(compgen -W "committed staged remote" -- "$cur")); return ;;
    --format) COMPREPLY=($(compgen -W "safetensors" -- "$cur")); return ;;
    --tier) COMPREPLY=($(compgen -W "local remote ram peer" -- "$cur")); return ;;
    --timeout_ms|--max_file_bytes|--interval_ms|--sample|--seed) COMPREPLY=(); return ;;
    --target_job) COMPREPLY=($(compgen -W "$(_ckptctl_ask "$ctl")" -- "$cur")); return ;;
  esac
  if [[ -z "$cmd" ]]; then
    COMPREPLY=($(compgen -W "$commands --socket --json --help" -- "$cur"))
    return
  fi
  if [[ "$cur" == -* ]]; then
    local opts=""
    case "$cmd" in
      wait) opts="--timeout_ms --until" ;;
      reshard) opts="--target_job" ;;
      gc) opts="--dry_run" ;;
      watch) opts="--interval_ms --until_idle --plain" ;;
      export) opts="--format --max_file_bytes --force" ;;
      verify) opts="--sample --seed --tier --timeout_ms" ;;
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    return
  fi
  local n=${#args[@]}
  case "$cmd" in
    ls|du|latest|gc|watch|status|inspect|rm|wait|reshard|abort|prefetch|export|verify)
      if ((n == 0)); then
        COMPREPLY=($(compgen -W "$(_ckptctl_ask "$ctl")" -- "$cur"))
      elif ((n == 1)) && [[ "$cmd" != ls && "$cmd" != du && "$cmd" != latest && "$cmd" != gc &&
                            "$cmd" != watch ]]; then
        local steps; steps="$(_ckptctl_ask "$ctl" "${args[0]}")"
        [[ "$cmd" == export || "$cmd" == prefetch || "$cmd" == verify ]] && steps+=" latest"
        COMPREPLY=($(compgen -W "$steps" -- "$cur"))
      elif [[ "$cmd" == export ]]; then
        COMPREPLY=($(compgen -d -- "$cur"))
      fi
      ;;
  esac
}
complete -F _ckptctl ckptctl
