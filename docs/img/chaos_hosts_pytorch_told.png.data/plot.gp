set terminal pngcairo size 1200,600
set output "docs/img/chaos_hosts_pytorch_told.png"
set xlabel 'wall time (s)'
set ylabel 'step done'
set key top left
set title 'Training progress under injected faults'
plot "docs/img/chaos_hosts_pytorch_told.png.data/progress-0.dat" using 1:2 with lines lw 2 lc rgb '#1f77b4' title "trainguard (ETTR 97.2%)", \
     "docs/img/chaos_hosts_pytorch_told.png.data/faults-0.dat" using 1:2 with points pt 7 ps 1.2 lc rgb '#1f77b4' title "trainguard faults", "docs/img/chaos_hosts_pytorch_told.png.data/faults-0.dat" using 1:2:3 with labels offset 0,1 font ',8' tc rgb '#1f77b4' noenhanced notitle, \
     "docs/img/chaos_hosts_pytorch_told.png.data/progress-1.dat" using 1:2 with lines lw 2 lc rgb '#d62728' title "baseline (ETTR 65.8%)", \
     "docs/img/chaos_hosts_pytorch_told.png.data/faults-1.dat" using 1:2 with points pt 7 ps 1.2 lc rgb '#d62728' title "baseline faults", "docs/img/chaos_hosts_pytorch_told.png.data/faults-1.dat" using 1:2:3 with labels offset 0,1 font ',8' tc rgb '#d62728' noenhanced notitle
