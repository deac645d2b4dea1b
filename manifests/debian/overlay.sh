# Sourced by manifests/debian/nvidia and manifests/debian/kata: a layer made as the upper
# directory of an overlay over the real base tree. Packages are installed by apt and dpkg in the
# merged tree, so their maintainer scripts run against the base they will be stacked on (users,
# alternatives, triggers), and whatever they change of the base lands in the upper directory,
# which becomes the layer after the clean-up below.
#
# Needs: BASE (the base tree), STATE (the base's /var/lib/dpkg, kept by `build` before the base's
# /var is emptied), CACHE (INGOT_DEBIAN_CACHE), MIRROR, SECURITY_MIRROR, die().

# The base files a layer may replace: the indexes that must be regenerated over base + layer
# (docs/boot-contract.md, "Layers"). Anything else of the base changed by an install is refused.
MERGED_INDEXES='^etc/ld\.so\.cache$|^usr/lib/modules/[^/]+/modules\.(alias|alias\.bin|builtin\.alias\.bin|builtin\.bin|dep|dep\.bin|devname|softdep|symbols|symbols\.bin)$|^usr/lib/ingot/dpkg/status$'

OV_MOUNTS=()

# overlay_up WORK: mounts the overlay (upper WORK/upper) at WORK/merged with /proc, /sys, /dev,
# the package cache and an apt configuration of its own (under /tmp, which is not kept).
overlay_up() {
  local w=$1
  OV=$w
  mkdir -p "$w/upper" "$w/work" "$w/merged" "$w/state/var/lib"
  cp -a "$STATE" "$w/state/var/lib/dpkg"
  # No metacopy (an upper file without its data), no redirects, no index: plain copy-up only.
  mount -t overlay overlay \
    -o "lowerdir=$w/state:$BASE,upperdir=$w/upper,workdir=$w/work,metacopy=off,redirect_dir=off,index=off" \
    "$w/merged"
  OV_MOUNTS=("$w/merged")
  local m=$w/merged
  mount -t proc proc "$m/proc" && OV_MOUNTS+=("$m/proc")
  mount -t sysfs sysfs "$m/sys" && OV_MOUNTS+=("$m/sys")
  mount --bind /dev "$m/dev" && OV_MOUNTS+=("$m/dev")
  mkdir -p "$CACHE/debs" "$m/var/cache/apt/archives"
  mount --bind "$CACHE/debs" "$m/var/cache/apt/archives" && OV_MOUNTS+=("$m/var/cache/apt/archives")
  # The base's initrd is the only one (the writer copies it from the base): a layer's package
  # must not make another one. update-initramfs reads this setting.
  printf 'update_initramfs=no\nbackup_initramfs=no\n' >"$w/initramfs.conf"
  mount --bind "$w/initramfs.conf" "$m/etc/initramfs-tools/update-initramfs.conf" &&
    OV_MOUNTS+=("$m/etc/initramfs-tools/update-initramfs.conf")
  # The base's /var is empty: what apt and dpkg write there (dropped with var/ at the end).
  mkdir -p "$m/tmp/apt/lists/partial" "$m/tmp/apt/parts" "$m/var/log/apt" "$m/var/cache/debconf" \
    "$m/var/lib/apt" "$m/var/tmp"
  local comp="main contrib non-free non-free-firmware"
  cat >"$m/tmp/apt/sources.list" <<EOF
deb $MIRROR bookworm $comp
deb $MIRROR bookworm-updates $comp
deb $SECURITY_MIRROR bookworm-security $comp
EOF
  cat >"$m/tmp/apt/apt.conf" <<'EOF'
Dir::Etc::SourceList "/tmp/apt/sources.list";
Dir::Etc::SourceParts "/tmp/apt/parts";
Dir::State::Lists "/tmp/apt/lists";
APT::Install-Recommends "false";
APT::Sandbox::User "root";
Dpkg::Options { "--path-exclude=/usr/share/doc/*"; "--path-include=/usr/share/doc/*/copyright"; "--path-exclude=/usr/share/man/*"; "--path-exclude=/usr/share/locale/*"; "--path-exclude=/usr/share/info/*"; };
EOF
}

# in_overlay CMD...: runs CMD chrooted in the merged tree, apt reading the configuration above.
in_overlay() {
  chroot "$OV/merged" env APT_CONFIG=/tmp/apt/apt.conf DEBIAN_FRONTEND=noninteractive \
    LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

overlay_down() {
  local i
  for ((i = ${#OV_MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${OV_MOUNTS[$i]}" 2>/dev/null || umount -l "${OV_MOUNTS[$i]}"
  done
  OV_MOUNTS=()
}

# cleanup WORK: unmounts and removes WORK, never while anything is still mounted below it (the
# merged tree has the host's /dev bound in).
cleanup() {
  overlay_down
  if grep -q " $1/" /proc/self/mounts; then
    echo "still mounted below $1, not removed" >&2
  else
    rm -rf --one-file-system "$1"
  fi
}

# accounts_to_sysusers NAME: the users and groups the install added to the base's /etc/passwd and
# /etc/group become /usr/lib/sysusers.d/NAME.conf, and the layer keeps no account file: a layer's
# /etc/passwd would hide the base's (and any other layer's) for good. systemd-sysusers makes them
# at every boot (/etc is volatile), before the units that need them. Any other change to an
# account file (a base entry changed or removed) is refused. Run while mounted.
accounts_to_sysusers() {
  local u=$OV/upper conf=$OV/merged/usr/lib/sysusers.d/$1.conf f changed name gecos home shell
  local lines=() users=" "
  for f in passwd group shadow gshadow; do
    [ -e "$u/etc/$f" ] || continue
    changed=$(diff "$BASE/etc/$f" "$u/etc/$f" | grep '^<' || true)
    [ -z "$changed" ] || die "the install changed the base's /etc/$f entries: $changed"
  done
  if [ -e "$u/etc/passwd" ]; then
    while IFS=: read -r name _ _ _ gecos home shell; do
      lines+=("u $name - \"$gecos\" $home $shell")
      users+="$name "
    done < <(diff "$BASE/etc/passwd" "$u/etc/passwd" | sed -n 's/^> //p')
  fi
  if [ -e "$u/etc/group" ]; then
    while IFS=: read -r name _; do
      # `u` makes the user's own group.
      case "$users" in *" $name "*) continue ;; esac
      lines+=("g $name -")
    done < <(diff "$BASE/etc/group" "$u/etc/group" | sed -n 's/^> //p')
  fi
  if [ ${#lines[@]} -gt 0 ]; then
    mkdir -p "$(dirname "$conf")"
    {
      echo "# Made by ingot's manifests/debian from what the packages' maintainer scripts added."
      printf '%s\n' "${lines[@]}"
    } >"$conf"
  fi
  rm -f "$u/etc/passwd" "$u/etc/group" "$u/etc/shadow" "$u/etc/gshadow"
}

# direct_links: every symlink whose target goes through /etc/alternatives is replaced by a link
# straight to the final target (resolved in the merged tree). /etc is writable on a node: a
# write there must not change which libcuda or nvidia-smi runs. Run while mounted.
direct_links() {
  local m=$OV/merged rel target final
  while IFS= read -r -d '' rel; do
    rel=${rel#"$OV/upper/"}
    case "$rel" in etc/alternatives/*) continue ;; esac
    target=$(readlink "$m/$rel")
    case "$target" in /etc/alternatives/*) ;; *) continue ;; esac
    final=$(chroot "$m" readlink -e "/$rel") || die "/$rel -> $target leads nowhere"
    ln -sfn "$final" "$OV/upper/$rel"
  done < <(find "$OV/upper" -type l -print0)
}

# layer_from_upper DEST: the upper directory, checked and cleaned, becomes the layer at DEST.
# Run after overlay_down. Refuses whiteouts (a layer cannot delete a base file) and an opaque
# directory that would hide base entries; removes every trusted.overlay.* attribute (the
# overlay's own bookkeeping: `ingot build` refuses it in a dir source); drops var/, run/, tmp/
# (/var is the var partition's; the others are mount points) and the install's own leftovers.
layer_from_upper() {
  local dest=$1 u=$OV/upper rel name
  [ -z "$(find "$u" -type c -print -quit)" ] || die "the install deleted base files (whiteouts): $(find "$u" -type c | sed "s|^$u/||" | head -5 | tr '\n' ' ')"
  rm -rf "$u/var" "$u/run" "$u/tmp" "$u/root" "$u/boot"
  rm -f "$u/etc/.pwd.lock" "$u/etc/passwd-" "$u/etc/group-" "$u/etc/shadow-" "$u/etc/gshadow-" \
    "$u/etc/subuid-" "$u/etc/subgid-"
  # An opaque directory hides the lower one's entries; stripping the mark must not change what
  # the merged tree shows, so the base's directory at that path must have nothing the layer's lacks.
  while IFS= read -r -d '' rel; do
    rel=${rel#"$u"}
    [ -d "$BASE$rel" ] || continue
    for name in $(ls -A "$BASE$rel"); do
      [ -e "$u$rel/$name" ] || [ -L "$u$rel/$name" ] ||
        die "$rel is opaque in the overlay and the base's $rel/$name would show through"
    done
  done < <(find "$u" -type d -print0 | xargs -0 -r getfattr -h --absolute-names -n trusted.overlay.opaque 2>/dev/null |
    sed -n 's/^# file: //p' | tr '\n' '\0')
  getfattr -R -h -P --absolute-names -d -m '^trusted\.overlay\.' "$u" 2>/dev/null |
    while IFS= read -r line; do
      case "$line" in
        "# file: "*) rel=${line#"# file: "} ;;
        trusted.overlay.*=*) setfattr -h -x "${line%%=*}" "$rel" ;;
      esac
    done
  [ -z "$(getfattr -R -h -P --absolute-names -d -m '^trusted\.overlay\.' "$u" 2>/dev/null)" ] ||
    die "trusted.overlay.* attributes left in $u"
  rm -rf "$dest"
  mv "$u" "$dest"
}

# changed_base_files LAYER: the base's files the layer replaces (paths relative to /).
changed_base_files() {
  local l=$1 rel
  (cd "$l" && find . ! -type d -print | sed 's|^\./||') | while IFS= read -r rel; do
    if [ -e "$BASE/$rel" ] || [ -L "$BASE/$rel" ]; then echo "$rel"; fi
  done
}

# check_changed_base LAYER WHAT: dies when the layer replaces a base file that is not a merged
# index (MERGED_INDEXES); WHAT names the layer.
check_changed_base() {
  local bad
  bad=$(changed_base_files "$1" | grep -Ev "$MERGED_INDEXES" || true)
  [ -z "$bad" ] || die "the $2 layer would replace base files other than the merged indexes: $(echo $bad)"
}
